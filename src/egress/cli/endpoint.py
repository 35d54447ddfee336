"""``egress endpoint resume NAME [URL]``: resume a webhook endpoint its breaker paused, on a running
instance (``egress run --http-port``), through ``POST /endpoints/NAME/resume``. In a cluster the
command asks the worker at URL for its ``/status``, then every live member that serves a status
endpoint (its ``status_url`` in ``members``, as ``egress status`` does), so every partition's sink
resumes whichever worker runs it. Raising the endpoint's ``resume`` in the DynamicSpec does the same
and lasts across restarts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import typer

from egress.cli.output import command_group
from egress.cli.status import FETCH_TIMEOUT, StatusUnavailable, UrlArgument, fetch, status_url

endpoint_app = command_group(no_args_is_help=True, help="Webhook endpoints of a running instance.")


@dataclass
class Resumed:
    """What a resume reached: ``instances`` the sink instances resumed in all, ``unknown`` the status
    URLs whose worker runs no sink that knows the endpoint, ``failures`` one line per worker that did
    not answer (URL and cause)."""

    instances: int = 0
    unknown: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def resume_everywhere(name: str, url: str, timeout: float = FETCH_TIMEOUT) -> Resumed:
    """Resume endpoint ``name`` on the instance whose ``/status`` is at ``url`` and, in a cluster, on
    every other live member with a ``status_url``. Never raises for an unreachable worker: it is
    listed in ``failures`` (the others are still resumed)."""
    result = Resumed()
    try:
        document = fetch(url, timeout)
    except StatusUnavailable as error:
        result.failures.append(str(error))
        return result
    targets = [url]
    for member in document.get("members") or []:
        if member.get("worker_id") == document.get("worker"):
            continue
        if member.get("status_url"):
            targets.append(status_url(member["status_url"]))
        else:
            result.failures.append(f"{member.get('worker_id')}: serves no status endpoint (started without "
                                   "--http-port): resume it through the DynamicSpec")
    for target in targets:
        _resume_one(name, target, timeout, result)
    return result


def _resume_one(name: str, url: str, timeout: float, result: Resumed) -> None:
    """``POST /endpoints/NAME/resume`` on the instance whose ``/status`` is ``url``, into ``result``."""
    import json
    import urllib.error  # here: a worker that imports the command line never posts
    import urllib.parse
    import urllib.request

    target = f"{url.removesuffix('/status')}/endpoints/{urllib.parse.quote(name, safe='')}/resume"
    try:
        with urllib.request.urlopen(urllib.request.Request(target, method="POST"), timeout=timeout) as answer:
            result.instances += int(json.loads(answer.read())["resumed"])
    except urllib.error.HTTPError as error:
        if error.code == 404:
            result.unknown.append(url)
        else:
            result.failures.append(f"{target}: HTTP {error.code} {error.reason}")
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as error:
        result.failures.append(f"cannot reach {target}: {getattr(error, 'reason', error)}")


@endpoint_app.command("resume")
def resume_command(
    name: Annotated[str, typer.Argument(
        metavar="NAME", help="The endpoint's name in the endpoint table (its URL with url_column).")],
    url: UrlArgument = None,
) -> None:
    """Resume endpoint NAME (its breaker closed, its waiting messages sent) on the instance at URL and,
    in a cluster, on every other worker. Exit code 1 when a worker does not answer or no sink knows NAME."""
    result = resume_everywhere(name, status_url(url))
    for failure in result.failures:
        typer.echo(f"egress endpoint resume: {failure}", err=True)
    if not result.instances and not result.failures:
        where = ", ".join(result.unknown)
        typer.echo(f"egress endpoint resume: no webhook sink at {where} knows endpoint {name!r} (check the name "
                   "in /status)", err=True)
        raise typer.Exit(1)
    if result.instances:  # nothing reached: the failures above are the whole answer
        typer.echo(f"endpoint {name} resumed in {result.instances} sink instance(s)")
    if result.failures:
        raise typer.Exit(1)
