"""``egress state dump``: print the keyed state a pipeline committed, one JSON object per line;
``egress state delete``: delete a pipeline's NATS bucket, so that its next run starts over.

Reads the state directory read-only, so it works while ``egress run`` holds it (it shows the last
committed epoch). Lines look like::

    {"kind": "external", "table": "/state", "key": ["user-1"], "row": {"total_length": 42}}
    {"kind": "internal", "computation": "request_processor", "state": "request_state",
     "key": ["user-1", 7], "value": {"failed_attempts": 1, "request": {...}}}

A byte string (``bytes`` in a ``str`` column of an external table) is shown as
``{"$bytes": "<base64>"}`` (standard alphabet, padded), so every line is JSON whatever the bytes are;
text stays a JSON string.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Optional

import orjson
import typer
from rich.console import Console

from egress.cli.output import command_group
from egress.engines import SOURCE_PREFIX
from egress.engines.sqlite import read_state
from egress.errors import EgressError, StateDirectoryError
from egress.rows import bytes_as_json, decode_row

app = command_group(add_completion=False, no_args_is_help=True,
                  help="Inspect committed keyed state (dump), or delete a cluster's NATS bucket (delete).")


@app.callback()
def state() -> None:
    """Inspect the keyed state a pipeline committed (internal state and external state tables)."""


def state_lines(state_dir: Path, *, name: str | None = None, internal: bool = True,
                external: bool = True) -> Iterator[dict[str, Any]]:
    """The committed state of ``state_dir`` as dicts (external tables first, then internal state),
    optionally only the table or state called ``name``. Raises ``StateDirectoryError``."""
    found = read_state(state_dir)
    if external:
        for _, table, key, row in found["external"]:
            if name in (None, table):
                yield {"kind": "external", "table": table, "key": orjson.loads(key), "row": decode_row(row)}
    if internal:
        for computation, state, key, value in _process_function_state(found):
            if name in (None, state):
                yield {"kind": "internal", "computation": computation, "state": state, "key": orjson.loads(key),
                       "value": orjson.loads(value)}


def state_names(state_dir: Path, *, internal: bool = True, external: bool = True) -> list[str]:
    """The names of the external tables and internal states of ``state_dir`` that hold committed
    rows: the names ``state_lines(name=...)`` yields something for. Raises ``StateDirectoryError``."""
    found = read_state(state_dir)
    tables = {table for _, table, _, _ in found["external"]} if external else set()
    states = {state for _, state, _, _ in _process_function_state(found)} if internal else set()
    return sorted(tables | states)


def _process_function_state(found: dict[str, list[tuple[str, str, bytes, bytes]]]
                            ) -> Iterator[tuple[str, str, bytes, bytes]]:
    """The internal state rows of ``read_state``'s answer that process functions wrote: a source
    reader's position state (computation ``source:<id>``, docs/sources.md) is the runtime's own."""
    return (row for row in found["internal"] if not row[0].startswith(SOURCE_PREFIX))


@app.command()
def dump(
    state_dir: Annotated[Path, typer.Argument(
        metavar="STATE_DIR", help="The --state-dir of the pipeline (default .egress/<pipeline>).")],
    name: Annotated[Optional[str], typer.Option(help="Only this external table or internal state.")] = None,  # noqa: UP045
    external_only: Annotated[bool, typer.Option("--external", help="Only external state tables.")] = False,
    internal_only: Annotated[bool, typer.Option("--internal", help="Only internal state.")] = False,
) -> None:
    """Print committed external state rows and internal state values as JSON lines (bytes as
    {"$bytes": "<base64>"}).

    Exit codes: 0 printed (without --name, also when there is no row); 1 no egress state in STATE_DIR,
    or --name matched no committed row: a note on standard error then lists the names that have
    committed rows (a misspelt name and a state that holds no keys right now both print nothing).
    """
    try:
        printed = 0
        for line in state_lines(state_dir, name=name, internal=not external_only, external=not internal_only):
            typer.echo(orjson.dumps(line, default=bytes_as_json).decode())
            printed += 1
        if name is not None and not printed:
            names = state_names(state_dir, internal=not external_only, external=not internal_only)
            typer.echo(f"egress: no committed rows named {name!r} in {state_dir}; names with rows: "
                       f"{', '.join(names) if names else '(none)'}", err=True)
            raise typer.Exit(1)
    except StateDirectoryError as error:
        typer.echo(f"egress: {error}", err=True)
        raise typer.Exit(1) from None


@app.command()
def delete(
    pipeline: Annotated[str, typer.Argument(metavar="PIPELINE", help="The pipeline's name (the Spec's `pipeline`).")],
    engine: Annotated[str, typer.Option(help="The NATS servers of its cluster: nats://HOST:PORT[,HOST:PORT...] "
                                             "(as given to egress run --engine).")],
    yes: Annotated[bool, typer.Option("--yes", help="Delete without asking (needed when standard input is not a "
                                                    "terminal).")] = False,
) -> None:
    """Delete a pipeline's NATS bucket and everything committed in it (log, outbox, state, timers,
    leases), so that its next run starts over; refused while a worker of the pipeline runs. (A SQLite
    state directory is deleted as a folder: rm -r DIR.)

    Exit codes: 0 deleted; 1 no such bucket (as `state dump` for a folder without egress state), a
    worker runs, or the server cannot be used; 2 a usage problem, or not confirmed.
    """
    from egress.cli.output import LogFormatChoice, LogLevelChoice, start_output
    from egress.runtime.options import parse_engine

    try:
        choice = parse_engine(engine)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--engine") from None
    if not choice.is_nats:
        raise typer.BadParameter("deletes a NATS bucket: give nats://HOST:PORT; a SQLite state directory is a folder "
                                 "(rm -r DIR)", param_hint="--engine")
    output = start_output(Console(stderr=True, soft_wrap=True), LogFormatChoice.text, LogLevelChoice.warning,
                          "egress.state", urls=(engine,))
    try:
        deleted = asyncio.run(_delete_bucket(list(choice.servers), pipeline, yes))
    except EgressError as error:
        output.say(str(error), style="red")
        raise typer.Exit(1) from None
    if deleted is None:
        output.say("not deleted: confirm with --yes", style="red")
        raise typer.Exit(2)
    output.say(f"deleted {deleted}: the next run of pipeline {pipeline!r} starts over")


async def _delete_bucket(servers: list[str], pipeline: str, yes: bool) -> str | None:
    """Delete ``pipeline``'s bucket on ``servers`` once confirmed (``yes``, or a terminal's answer);
    the bucket's name and servers, or ``None`` when not confirmed. Raises ``NatsEngineError``, and
    ``StateDirectoryError`` naming the live workers or saying that there is no such bucket (none is
    created)."""
    from egress.engines.nats import NatsEngine

    engine = NatsEngine(servers, pipeline)
    try:
        await engine.open(create=False)
        members = await engine.members()
        if members:
            raise StateDirectoryError(
                f"{engine.location.name}: worker(s) {', '.join(m.worker_id for m in members)} of pipeline "
                f"{pipeline!r} are running on it: stop every worker first (a killed worker stays listed until "
                "its --lease-ttl lapses)")
        question = f"delete {engine.location.name} and everything committed in it?"
        if not (yes or (sys.stdin.isatty() and typer.confirm(question, err=True))):
            return None
    except BaseException:
        await engine.close()
        raise
    await engine.delete_bucket()
    return engine.location.name
