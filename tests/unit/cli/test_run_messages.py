"""``egress run``'s messages while it runs: the first dead letter of each sink and file; the
dashboard's address at once, also when standard error is not a terminal; a DynamicSpec changed
while the run starts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import typer
from rich.console import Console

from egress.cli import main
from egress.cli.main import PROGRESS_PERIOD, _Reporter
from egress.cli.output import Output
from egress.clock import VirtualClock
from egress.connectors.dead_letters import DeadLetter, DeadLetterFiles
from egress.observe import StatusTree
from egress.runtime import Pipeline, RunResult, load_plan
from tests.conftest import payload_spec


def test_egress_run_prints_the_first_dead_letter_of_each_sink_and_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both sinks' first letters are printed, though the latest letter at the progress tick is another."""
    files = DeadLetterFiles()

    async def write() -> None:
        output = files.open(tmp_path / "dead.jsonl")
        await output.append([_letter("http", 1), _letter("audit", 2), _letter("http", 3)])

    asyncio.run(write())
    pipeline = SimpleNamespace(dead_letters=files, server=None, dynamic_spec_version=0, dynamic_spec_error=None,
                               status=StatusTree())
    reporter = _Reporter(cast(Pipeline, pipeline))
    reporter.news()
    reporter.news()
    printed = [line for line in capsys.readouterr().err.splitlines() if line]
    assert [line.split(" written to ")[0] for line in printed] == [
        "dead letter of deliver/http partition 0 seq 1", "dead letter of deliver/audit partition 0 seq 2"]


def _letter(sink: str, seq: int) -> DeadLetter:
    return DeadLetter("deliver", sink, 0, seq, b"m%d" % seq, "6D", b"x", (), "exhausted", 2.0)


class _Serving:
    """A pipeline's status server that has started (``port`` and ``address``)."""

    port = 8123
    address = "127.0.0.1:8123"


def test_egress_run_says_the_dashboard_address_at_once_when_stderr_is_not_a_terminal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Not after the first progress period: the fake run ends only once the address was said, and
    gives up long before that period."""
    said: list[str] = []
    address_said = asyncio.Event()

    class Recording(Output):
        def say(self, text: str, **_: object) -> None:
            said.append(text)
            if text.startswith("dashboard, metrics and status at http://127.0.0.1:8123/"):
                address_said.set()

    async def run() -> RunResult:
        pipeline.server = _Serving()
        await asyncio.wait_for(address_said.wait(), timeout=PROGRESS_PERIOD * 0.6)
        return RunResult(drained=True)

    pipeline = SimpleNamespace(run=run, server=None, dynamic_spec_version=0, dynamic_spec_error=None,
                               status=StatusTree(), dead_letters=DeadLetterFiles(), running=True,
                               request_stop=lambda: None, interrupt=lambda: None)
    monkeypatch.setattr(main, "console", Console(stderr=True, force_terminal=False))
    monkeypatch.setattr(main, "output", Recording(main.console))
    result = asyncio.run(main._drive(cast(Pipeline, pipeline), quiet=False))
    assert result.drained
    assert said[0].startswith("dashboard, metrics and status at http://127.0.0.1:8123/")


async def test_a_dynamic_spec_changed_while_the_run_starts_is_read_and_its_error_told(tmp_path: Path) -> None:
    """The file is compared with what the plan read, not with what it was once the run had started."""
    spec, dynamic = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a"])
    clock = VirtualClock()
    pipeline = Pipeline(load_plan(spec, dynamic), tmp_path / "state", clock=clock)
    dynamic.write_text("computations: {deliver: {sinks: {http: {parameters: {retry_initial_delay: soon}}}}}\n")
    watching = asyncio.create_task(pipeline.dynamic_spec.watch())
    await clock.advance(pipeline.options.dynamic_spec_period)
    pipeline.request_stop()
    await clock.advance(pipeline.options.dynamic_spec_period)
    await watching
    assert pipeline.dynamic_spec_error is not None
    assert "retry_initial_delay: cannot parse duration 'soon'" in pipeline.dynamic_spec_error


@pytest.mark.parametrize("drained", [True, False])
def test_nothing_new_is_said_only_of_a_run_that_drained(
        tmp_path: Path, drained: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A run that read and sent nothing says the state holds everything only when it drained; a run
    stopped before (Ctrl-C during a live source's run, or before a server was reached) says nothing of
    what the sources still have, and gives no advice to start over."""
    spec, dynamic = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a"])
    pipeline = Pipeline(load_plan(spec, dynamic), tmp_path / "state")
    monkeypatch.setattr(main, "console", Console(stderr=True, force_terminal=False, soft_wrap=True))
    monkeypatch.setattr(main, "output", Output(main.console))
    with pytest.raises(typer.Exit) as ended:
        main._finish(pipeline, RunResult(drained=drained), spec=spec, dynamic_spec=dynamic,
                     directory=tmp_path / "state", report=None, quiet=False, until_drained=drained)
    assert ended.value.exit_code == 0
    said = capsys.readouterr().err
    assert ("nothing new: state directory" in said) is drained, said


def test_a_sink_error_names_its_computation_says_once_that_it_retries_and_ignores_libcurls_elapsed_time(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The same refused connection with another "after N ms" is not printed again; another error is."""
    status = StatusTree()
    computation = SimpleNamespace(computation_id="to_json", sinks={"http": object()})
    pipeline = SimpleNamespace(dead_letters=DeadLetterFiles(), server=None, dynamic_spec_version=0,
                               dynamic_spec_error=None, status=status,
                               plan=SimpleNamespace(computations={"to_json": computation}))
    reporter = _Reporter(cast(Pipeline, pipeline))
    refused = "Async HTTP POST failed: curl error 7: Failed to connect to 127.0.0.1:9 after {} ms: Could not connect"
    status.set_error("/sinks/http/async_http_sink", 1, refused.format(3))
    reporter.news()
    status.set_error("/sinks/http/async_http_sink", 1, refused.format(0))
    reporter.news()
    status.set_error("/sinks/http/async_http_sink", 1, "Async HTTP POST failed: HTTP status 503")
    reporter.news()
    printed = [line for line in capsys.readouterr().err.splitlines() if line]
    assert printed == [
        f"computation to_json sink http: {refused.format(3)} (the sink retries by its retry policy until delivered "
        "or given up; the progress line counts the retries)",
        "computation to_json sink http: Async HTTP POST failed: HTTP status 503"]
