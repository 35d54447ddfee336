"""``egress status [URL]``: a running instance's ``/status`` JSON in the terminal, once or ``--watch``.

In a cluster, any worker's ``/status`` lists every partition with its owner and input lag, but the
sinks' state (unacknowledged messages, a blocking error, the status tree) only of the partitions
it runs: the command also asks every other live member that serves a status endpoint (its
``status_url`` in ``members``) and shows each partition as its owner reports it, so the whole
pipeline appears, whichever worker is asked.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console, Group, RenderableType
from rich.text import Text

from egress.errors import EgressError

if TYPE_CHECKING:
    from rich.table import Table

DEFAULT_URL = "http://127.0.0.1:8000"
FETCH_TIMEOUT = 5.0  # seconds: a status request answers from memory and a few engine reads

UrlArgument = Annotated[Optional[str], typer.Argument(  # noqa: UP045 - typer needs Optional
    help="The instance's status endpoint: http://HOST:PORT (as `egress run --http-port` prints it) or its "
         f"/status URL (default: $EGRESS_STATUS_URL, else {DEFAULT_URL}).", show_default=False)]


class StatusUnavailable(EgressError):
    """The status endpoint did not answer with ``/status`` JSON."""


def status_url(url: str | None) -> str:
    """The ``/status`` URL of ``url`` (a base URL, ``HOST:PORT``, or the ``/status`` URL itself)."""
    url = (url or os.environ.get("EGRESS_STATUS_URL") or DEFAULT_URL).strip()
    if "://" not in url:
        url = f"http://{url}"
    url = url.rstrip("/")
    return url if url.endswith("/status") else f"{url}/status"


def fetch(url: str, timeout: float = FETCH_TIMEOUT) -> dict[str, Any]:
    """The JSON document at ``url``. Raises :class:`StatusUnavailable` naming the URL and the cause."""
    import urllib.error  # here: a worker that imports the command line never fetches
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            document = json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise StatusUnavailable(f"{url}: HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise StatusUnavailable(f"{url}: {reason}; is an `egress run --http-port PORT` serving there? give its "
                                f"http://HOST:PORT as URL (default: $EGRESS_STATUS_URL, else {DEFAULT_URL})") from None
    except ValueError as error:
        raise StatusUnavailable(f"{url}: not JSON ({error})") from None
    if not isinstance(document, dict) or "partitions" not in document:
        raise StatusUnavailable(f"{url}: not an egress /status document")
    return document


def whole_pipeline(document: dict[str, Any], url: str, timeout: float = FETCH_TIMEOUT) -> dict[str, Any]:
    """``document`` (from ``url``) completed with what the other live members of its cluster report:
    each partition as its owner shows it, each source's unread records as its reader's worker does,
    every worker's status errors (``status`` keys prefixed by
    ``<worker>:``) and readiness; ``unreachable`` lists the members that did not answer. An embedded
    run's document is returned as it is."""
    members = [m for m in document.get("members") or [] if m.get("worker_id") != document.get("worker")]
    if not document.get("worker") or not members:
        return document
    by_worker: dict[str, dict[str, Any]] = {document["worker"]: document}
    unreachable: list[str] = []
    for member in members:
        member_url = member.get("status_url")
        if not member_url:
            unreachable.append(f"{member['worker_id']}: serves no status endpoint (started without --http-port)")
            continue
        try:
            by_worker[member["worker_id"]] = fetch(member_url, timeout)
        except StatusUnavailable as error:
            unreachable.append(f"{member['worker_id']}: {error}")
    merged = dict(document)
    merged["partitions"] = [_as_owner_reports(p, by_worker) for p in document["partitions"]]
    merged["sources"] = {source_id: _source_as_owner_reports(source_id, source, by_worker)
                         for source_id, source in (document.get("sources") or {}).items()}
    merged["status"] = {f"{worker}: {path}": error for worker, doc in by_worker.items()
                        for path, error in (doc.get("status") or {}).items()}
    reasons = [f"{worker}: {reason}" for worker, doc in by_worker.items()
               for reason in (doc.get("ready") or {}).get("reasons", [])]
    merged["ready"] = {"ready": not reasons and not unreachable, "reasons": reasons}
    merged["unreachable"] = unreachable
    return merged


def _source_as_owner_reports(source_id: str, source: dict[str, Any],
                             by_worker: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``source`` with the unread records its reader's worker reports (only it knows them)."""
    owner = by_worker.get(source.get("owner") or "")
    theirs = (owner.get("sources") or {}).get(source_id) if owner is not None else None
    if not theirs or theirs.get("unread_records") is None:
        return source
    return {**source, "unread_records": theirs["unread_records"]}


def _as_owner_reports(partition: dict[str, Any], by_worker: dict[str, dict[str, Any]]) -> dict[str, Any]:
    owner = by_worker.get(partition.get("owner") or "")
    if owner is None:
        return partition
    for theirs in owner["partitions"]:
        if (theirs["computation"], theirs["partition"]) == (partition["computation"], partition["partition"]):
            return {**partition, **{k: v for k, v in theirs.items() if v is not None}}
    return partition


def render(document: dict[str, Any], url: str) -> RenderableType:
    """The status of one instance (or cluster) as rich renderables: a header, the partitions, the
    sources, the errors in full, dead letters, and the cluster's members."""
    parts: list[RenderableType] = [_header(document, url), _partitions(document)]
    if any(p.get("endpoints") for p in document.get("partitions", [])):
        parts.append(_endpoints(document))
    if document.get("sources"):
        parts.append(_sources(document))
    parts.append(_errors(document))
    if (document.get("dead_letters") or {}).get("written"):
        parts.append(Text(f"dead letters: {json.dumps(document['dead_letters'])}", style="yellow"))
    if document.get("members"):
        parts.append(_members(document))
    for line in document.get("unreachable") or []:
        parts.append(Text(f"not asked: {line}", style="yellow"))
    return Group(*parts)


def _header(document: dict[str, Any], url: str) -> Text:
    ready = document.get("ready") or {}
    state = "stopping" if document.get("stopping") else "running" if document.get("running", True) else "stopped"
    text = Text(f"pipeline {document.get('pipeline')} at {url} (egress {document.get('version', '?')}): {state}, ")
    text.append("ready" if ready.get("ready", True) else "NOT READY", style="green" if ready.get("ready", True)
                else "bold red")
    if document.get("worker"):
        text.append(f"; asked worker {document['worker']}")
    dynamic = document.get("dynamic_spec") or {}
    if dynamic.get("file"):
        text.append(f"\nDynamicSpec {dynamic['file']} version {dynamic.get('version')}")
    for reason in ready.get("reasons", []):
        text.append(f"\n  not ready: {reason}", style="red")
    return text


def _partitions(document: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title="partitions", title_justify="left")
    for column in ("computation", "partition", "owner", "input lag", "lag seconds", "unacknowledged", "blocked"):
        table.add_column(column, justify="right" if column in ("partition", "input lag", "lag seconds",
                                                               "unacknowledged") else "left")
    for partition in document.get("partitions", []):
        unacknowledged = partition.get("unacknowledged")
        seconds = partition.get("input_lag_seconds")
        table.add_row(
            str(partition["computation"]), str(partition["partition"]), str(partition.get("owner") or "-"),
            _number(partition.get("input_lag")), "-" if seconds is None else f"{seconds:,.1f}",
            "-" if unacknowledged is None else ", ".join(f"{sink}: {n:,}" for sink, n in unacknowledged.items()),
            Text(partition.get("blocked") or "", style="red"))
    return table


ENDPOINT_STYLES = {"closed": "green", "half_open": "yellow", "open": "red", "paused": "bold red"}


def _endpoints(document: dict[str, Any]) -> Table:
    """The webhook sinks' endpoints, partitions summed (``egress.observe.dashboard.endpoint_summary``)."""
    from rich.table import Table

    from egress.observe.dashboard import endpoint_summary

    table = Table(title="webhook endpoints", title_justify="left")
    for column in ("computation", "sink", "endpoint", "state", "backlog", "delivered", "partitions"):
        table.add_column(column, justify="right" if column in ("backlog", "delivered", "partitions") else "left")
    for row in endpoint_summary(document.get("partitions", [])):
        table.add_row(row["computation"], row["sink_id"], row["endpoint"],
                      Text(row["state"].replace("_", "-"), style=ENDPOINT_STYLES[row["state"]]),
                      f"{row['backlog']:,}", f"{row['delivered']:,}", str(row["partitions"]))
    return table


def _sources(document: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title="sources", title_justify="left")
    for column in ("source", "finished", "unread records", "owner"):
        table.add_column(column, justify="right" if column == "unread records" else "left")
    for source_id, source in document["sources"].items():
        unread = source.get("unread_records")
        table.add_row(source_id, "yes" if source.get("finished") else "no", "unknown" if unread is None else
                      f"{unread:,}", str(source.get("owner") or "-"))
    return table


def _errors(document: dict[str, Any]) -> RenderableType:
    from rich.table import Table

    errors = document.get("status") or {}
    if not errors:
        return Text("status: no errors", style="green")
    table = Table(title="status errors", title_justify="left")
    table.add_column("path")
    table.add_column("error", style="red", overflow="fold")
    for path, error in sorted(errors.items()):
        table.add_row(path, error)
    return table


def _members(document: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title="members", title_justify="left")
    for column in ("worker", "host", "pid", "status"):
        table.add_column(column)
    for member in document["members"]:
        table.add_row(str(member.get("worker_id")), str(member.get("host", "-")), str(member.get("pid", "-")),
                      str(member.get("status_url") or "-"))
    return table


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def summary_line(document: dict[str, Any], url: str, at: float) -> str:
    """One line of the status of ``url`` for a pipe or a log (``--watch`` when standard output is
    not a terminal): the local time ``at`` (seconds since the epoch), the state, and the
    partitions' totals: input lag, unacknowledged messages, blocked partitions, status errors."""
    header = _header(document, url).plain.splitlines()[0]
    errors = len(document.get("status") or {})
    partitions = document.get("partitions", [])
    lag = sum(p.get("input_lag") or 0 for p in partitions)
    unacknowledged = sum(sum((p.get("unacknowledged") or {}).values()) for p in partitions)
    blocked = sum(1 for p in partitions if p.get("blocked"))
    return (f"{time.strftime('%H:%M:%S', time.localtime(at))} {header}; {len(partitions)} partitions, input lag "
            f"{lag:,}, unacknowledged {unacknowledged:,}, blocked {blocked}, errors {errors}")


def status_command(
    url: UrlArgument = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C (not on a terminal: a line per "
                                                        "refresh).")] = False,
    interval: Annotated[float, typer.Option(min=0.2, help="Seconds between refreshes with --watch.")] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the (cluster-wide) status JSON instead.")] = False,
) -> None:
    """Show a running instance's status: partitions (owner, input lag, unacknowledged, blocked),
    sources, the sinks' errors in full, dead letters; in a cluster, of the whole pipeline. With
    --watch and standard output not a terminal, one summary line per refresh (with --json, one JSON
    document per line). Exit code 1 when the instance does not answer."""
    endpoint = status_url(url)
    console = Console(soft_wrap=False)

    def current() -> dict[str, Any]:
        return whole_pipeline(fetch(endpoint), endpoint)

    try:
        if as_json and not watch:
            typer.echo(json.dumps(current(), indent=2))
        elif not watch:
            console.print(render(current(), endpoint))
        elif as_json or not console.is_terminal:  # a pipe or a file: one line per refresh, written at once
            while True:
                document = current()
                print(json.dumps(document) if as_json else summary_line(document, endpoint, time.time()), flush=True)
                time.sleep(interval)
        else:
            from rich.live import Live

            with Live(render(current(), endpoint), console=console, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(render(current(), endpoint), refresh=True)
    except StatusUnavailable as error:
        Console(stderr=True, soft_wrap=True).print(Text(f"egress status: cannot read {error}", style="red"),
                                                   highlight=False)  # one line: a pipe or a log keeps it whole
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
