"""What ``egress run`` imports before it reads its Spec: only its own command and what a run needs
(the fixed CPU every run pays; ``docs/benchmarks.md``, Session 11 — start-up)."""

from __future__ import annotations

import subprocess
import sys

# Modules a run never needs: the other commands, the CLI's rich output (made when first printed to),
# the YAML parser (for a YAML Spec only), the cluster engine and its client, aiohttp, tracing, and
# prometheus-client (imported when the sensors are first read as Prometheus families: a scrape), the
# cluster's modules (a worker's only) and the throttler's runtime (its client, controller and factory: a
# run with throttlers; every Spec still checks its DynamicSpec's throttlers with egress.throttler.models).
NOT_FOR_RUN = ("egress.cli.redrive", "egress.cli.status", "egress.cli.state", "egress.cli.throttler",
               "egress.cli.endpoint", "egress.cli.processes", "rich", "yaml", "egress.engines.nats", "nats",
               "aiohttp", "egress.observe.server", "egress.observe.dashboard", "opentelemetry",
               "prometheus_client", "egress.runtime.cluster", "egress.throttler.throttling",
               "egress.throttler.client", "egress.throttler.controller", "egress.throttler.factory",
               "egress.throttler.queue", "egress.throttler.transport")


def _loaded(statement: str) -> list[str]:
    probe = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m in NOT_FOR_RUN or m.startswith(tuple(f"{name}." for name in NOT_FOR_RUN))]


def test_an_embedded_run_imports_no_other_command_no_rich_no_cluster_and_no_throttler_runtime() -> None:
    loaded = _loaded("from egress.cli.main import command_line; command_line('run').registered_commands; "
                     "import egress.runtime.pipeline, egress.cli.report, egress.connectors.sinks.async_http, "
                     "egress.connectors.sources.files")
    assert _heavy(loaded) == []


def test_the_whole_command_line_still_has_every_command() -> None:
    from egress.cli.main import COMMANDS, app, command_line

    whole = {info.name for info in app.registered_commands} | {group.name for group in app.registered_groups}
    assert whole == COMMANDS == {"run", "validate", "receiver", "redrive", "status", "throttler", "state",
                                 "endpoint"}
    lean = command_line("run")
    assert [info.name for info in lean.registered_commands] == ["run"]
    assert lean.registered_groups == []
    assert lean.registered_callback is app.registered_callback  # egress --version, the group's help
