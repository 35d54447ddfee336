"""``egress endpoint resume NAME [URL]``: resume a webhook endpoint its breaker paused, on a running
instance (``egress run --http-port``), through ``POST /endpoints/NAME/resume``. Raising the
endpoint's ``resume`` in the DynamicSpec does the same and lasts across restarts; in a cluster,
this asks one worker (ask each, or use the DynamicSpec)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from egress.cli.status import FETCH_TIMEOUT, UrlArgument, status_url

endpoint_app = typer.Typer(no_args_is_help=True, help="Webhook endpoints of a running instance.")


@endpoint_app.command("resume")
def resume_command(
    name: Annotated[str, typer.Argument(help="The endpoint's name in the endpoint table (its URL with url_column).")],
    url: UrlArgument = None,
) -> None:
    """Resume endpoint NAME (its breaker closed, its waiting messages sent). Exit code 1 when the
    instance does not answer or runs no sink that knows NAME."""
    import urllib.error  # here: a worker that imports the command line never posts
    import urllib.parse
    import urllib.request

    base = status_url(url).removesuffix("/status")
    target = f"{base}/endpoints/{urllib.parse.quote(name, safe='')}/resume"
    try:
        with urllib.request.urlopen(urllib.request.Request(target, method="POST"), timeout=FETCH_TIMEOUT) as answer:
            resumed = json.loads(answer.read())["resumed"]
    except urllib.error.HTTPError as error:
        if error.code == 404:
            typer.echo(f"egress endpoint resume: no webhook sink at {base} knows endpoint {name!r} (check the name "
                       "in /status, or that this worker runs its partitions)", err=True)
        else:
            typer.echo(f"egress endpoint resume: {target}: HTTP {error.code} {error.reason}", err=True)
        raise typer.Exit(1) from None
    except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
        typer.echo(f"egress endpoint resume: cannot reach {target}: {getattr(error, 'reason', error)}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"endpoint {name} resumed in {resumed} sink instance(s)")
