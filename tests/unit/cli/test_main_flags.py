"""``egress --version`` and the exit codes in ``egress --help``."""

from __future__ import annotations

from typer.testing import CliRunner

import egress
from egress.cli.main import EXIT_CODES, app
from egress.cli.status import status_url


def test_version_prints_the_package_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"egress {egress.__version__}"


def test_help_lists_every_exit_code() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    assert "Exit codes:" in result.output
    paragraphs = [" ".join(paragraph.split()) for paragraph in result.output.split("\n\n")]
    for code, meaning in EXIT_CODES.items():
        assert f"{code}: {meaning}" in paragraphs, code
    assert set(EXIT_CODES) == {0, 1, 2, 130}


def test_status_url_accepts_a_base_url_host_and_port_or_the_status_url() -> None:
    assert status_url("http://127.0.0.1:9000/") == "http://127.0.0.1:9000/status"
    assert status_url("127.0.0.1:9000") == "http://127.0.0.1:9000/status"
    assert status_url("http://127.0.0.1:9000/status") == "http://127.0.0.1:9000/status"


def test_run_help_names_every_path_of_the_http_port() -> None:
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    help_text = " ".join(result.output.replace("│", " ").split())
    for path in ("dashboard at /", "/metrics", "/status", "/healthz", "/readyz"):
        assert path in help_text, path


def test_status_of_an_instance_that_does_not_answer_is_one_line_however_narrow_the_output() -> None:
    """Not wrapped at the console's width (80 columns in a pipe), so a log or ``grep`` keeps it whole."""
    result = CliRunner().invoke(app, ["status", "http://127.0.0.1:9/"], env={"COLUMNS": "40"})
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("egress status: cannot read http://127.0.0.1:9/status: ")


def test_status_and_endpoint_resume_of_an_instance_that_does_not_answer_say_where_to_point_them() -> None:
    """``endpoint resume`` also printed "endpoint X resumed in 0 sink instance(s)" when nothing answered."""
    status = CliRunner().invoke(app, ["status", "http://127.0.0.1:9/"], env={"COLUMNS": "250"})
    resume = CliRunner().invoke(app, ["endpoint", "resume", "UA", "http://127.0.0.1:9/"], env={"COLUMNS": "250"})
    assert (status.exit_code, resume.exit_code) == (1, 1)
    for result in (status, resume):
        assert "is an `egress run --http-port PORT` serving there? give its http://HOST:PORT as URL" in result.stderr
    assert "resumed" not in resume.stdout


def test_help_in_80_columns_keeps_every_option_name_and_the_bracketed_words_whole() -> None:
    """80 columns is a pipe's width: rich's panels cut option names to fit it (``--no-until-drai…``) and
    dropped ``[tracing]`` as markup; the plain help wraps instead."""
    from egress.cli.throttler import throttler_app

    run = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "80"})
    serve = CliRunner().invoke(throttler_app, ["serve", "--help"], env={"COLUMNS": "80"})
    assert (run.exit_code, serve.exit_code) == (0, 0)
    for result in (run, serve):
        assert "…" not in result.output
        assert max(len(line) for line in result.output.splitlines()) <= 80
        assert "egress[tracing]" in " ".join(result.output.split())
    assert "--until-drained / --no-until-drained" in run.output
    assert "--heartbeat-period" in run.output
    assert "nats://HOST:PORT[,HOST:PORT...]" in " ".join(run.output.split())


def test_usage_lines_name_the_arguments_as_the_readme_does() -> None:
    run = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "250"})
    redrive = CliRunner().invoke(app, ["redrive", "--help"], env={"COLUMNS": "250"})
    assert " run [OPTIONS] {SPEC}\n" in run.output  # the program is "root" under CliRunner
    assert " redrive [OPTIONS] {DEAD_LETTER_FILE} {SPEC}\n" in redrive.output
