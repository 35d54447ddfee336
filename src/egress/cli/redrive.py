"""``egress redrive DEAD_LETTER_FILE SPEC --sink COMPUTATION/SINK``: re-send dead letters.

Prints one line with what happened (delivered, already redriven, failed, an incomplete last line not
redriven) and one line per failed letter; exit code 0 when every letter of the sink is now delivered,
1 when some failed again or the file's last line is incomplete (not read, so not sent), 2 when
it cannot start (the Spec, the file or ``--sink``), each with a one-line error naming the fix.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.text import Text

from egress.cli.addresses import file_to_write
from egress.connectors.dead_letters import DeadLetter, DeadLetterFileError, redrive_record_path
from egress.errors import SpecError

if TYPE_CHECKING:
    from egress.runtime.redrive import RedriveReport

console = Console(stderr=True, soft_wrap=True)
SHOWN_FAILURES = 20


def redrive_command(
    dead_letter_file: Annotated[Path, typer.Argument(metavar="DEAD_LETTER_FILE",
                                                     help="The sink's dead_letter_path file.")],
    spec: Annotated[Path, typer.Argument(metavar="SPEC", help="The Spec file (.yson, .yaml or .json) with the sink.")],
    sink: Annotated[str, typer.Option("--sink", help="COMPUTATION/SINK: the HTTP sink to send through.")],
    dynamic_spec: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        "--dynamic-spec", help="The DynamicSpec file (retries, throttlers) of the sink.")] = None,
    throttler_url: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Share the throttlers of `egress throttler serve` at this URL (default: in this process).")] = None,
    report: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        callback=file_to_write,
        help="Write what was delivered and what failed (partition, seq, idempotency key) as JSON here.")] = None,
) -> None:
    """Re-send the dead letters of a sink through it, as the Spec configures it now, with their original
    idempotency keys; what is delivered is recorded in DEAD_LETTER_FILE.redriven and never sent again."""
    from egress.runtime.redrive import RedriveError, load_redrive_target, redrive  # not for every command

    try:
        target = load_redrive_target(spec, dynamic_spec, sink, dead_letter_file)
    except SpecError as error:
        console.print(Text(error.format(), style="red"), highlight=False)
        raise typer.Exit(2) from None
    except RedriveError as error:
        console.print(Text(f"egress redrive: {error}", style="red"), highlight=False)
        raise typer.Exit(2) from None
    try:
        outcome = asyncio.run(redrive(target, dead_letter_file, throttler_url=throttler_url))
    except (RedriveError, DeadLetterFileError) as error:
        console.print(Text(f"egress redrive: {error}", style="red"), highlight=False)
        raise typer.Exit(2) from None
    _print(outcome)
    if report is not None:
        report.write_text(json.dumps(report_document(outcome), indent=2) + "\n")
    raise typer.Exit(0 if outcome.ok else 1)


def report_document(report: RedriveReport) -> dict[str, Any]:
    """``--report``: ``delivered`` and ``failed`` letters (``failed`` with their error), the counts."""
    def entry(letter: DeadLetter) -> dict[str, Any]:
        return {"partition": letter.partition, "seq": letter.seq, "message_id": letter.message_id.hex(),
                "idempotency_key": letter.idempotency_key}

    return {"file": str(report.file), "sink": report.sink, "delivered": [entry(d) for d in report.delivered],
            "failed": [{**entry(letter), "error": error} for letter, error in report.failed],
            "already_redriven": report.already_redriven, "not_attempted": report.not_attempted,
            "other_sinks": dict(report.other_sinks)}


def _print(report: RedriveReport) -> None:
    typer.echo(f"redrive {report.file} through {report.sink}: {len(report.delivered)} delivered, "
               f"{report.already_redriven} already redriven, {len(report.failed)} failed"
               + (f", {report.not_attempted} not attempted" if report.not_attempted else "")
               + (f", the incomplete last line ({report.torn_bytes} bytes) not redriven" if report.torn_bytes else ""))
    for letter, error in report.failed[:SHOWN_FAILURES]:
        console.print(Text(f"failed: partition {letter.partition} seq {letter.seq} key {letter.idempotency_key}: "
                           f"{error}", style="yellow"), highlight=False)
    if len(report.failed) > SHOWN_FAILURES:
        console.print(f"... and {len(report.failed) - SHOWN_FAILURES} more failed", highlight=False)
    if report.failed or report.not_attempted:
        console.print("the letters that failed stay in the file: run egress redrive again once the cause is fixed",
                      highlight=False)
    if report.delivered:
        console.print(f"recorded in {redrive_record_path(report.file)}: another redrive skips them", highlight=False)
    for name, count in sorted(report.other_sinks.items()):
        console.print(f"{count} line(s) of sink {name} left alone (redrive them with --sink {name})", highlight=False)
    if report.torn_bytes:
        console.print(f"the last {report.torn_bytes} byte(s) of {report.file} are not a complete line (cut by a crash, "
                      "or being written now): not redriven; if that line is a whole letter, add the missing "
                      "newline at its end and run egress redrive again", highlight=False)
