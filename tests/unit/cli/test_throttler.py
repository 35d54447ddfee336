"""``egress throttler serve`` argument handling (the running service is covered by the e2e test)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from egress.cli.throttler import throttler_app


def test_serve_rejects_an_invalid_dynamic_spec_with_exit_code_2(tmp_path: Path) -> None:
    dynamic = tmp_path / "dynamic.yaml"
    dynamic.write_text("throttlers: {q: {use_class_weights_as_limit: true}}\n")
    result = CliRunner().invoke(throttler_app, ["serve", "--dynamic-spec", str(dynamic), "--port", "0"])
    assert result.exit_code == 2
    assert 'throttlers/q: use_class_weights_as_limit requires at least one class in "classes"' in result.output


def test_serve_help_names_the_options() -> None:
    result = CliRunner().invoke(throttler_app, ["serve", "--help"])
    assert result.exit_code == 0
    assert "--dynamic-spec" in result.output
    assert "--port" in result.output
    assert "--state-file" in result.output
