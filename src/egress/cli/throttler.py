"""``egress throttler ...``: the standalone distributed throttler service."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from egress.cli.addresses import cannot_listen
from egress.cli.output import (
    LogFormatChoice,
    LogFormatOption,
    LogLevelChoice,
    LogLevelOption,
    command_group,
    start_output,
)
from egress.clock import RealClock
from egress.errors import SpecError

throttler_app = command_group(add_completion=False, no_args_is_help=True,
                            help="The distributed throttler service that many `egress run` processes share.")
console = Console(stderr=True, soft_wrap=True)


@throttler_app.callback()
def throttler() -> None:
    """The distributed throttler service that many `egress run` processes share."""


def _start_tracing(endpoint: str | None, output: Any) -> None:
    """Tracing of the controller's decisions (``egress.observe.tracing``, imported only when asked);
    exit 2 with the fix when it cannot start."""
    import atexit

    from egress.errors import TracingConfigError
    from egress.observe import tracing

    try:
        tracing.configure(endpoint, service_name=tracing.THROTTLER_SERVICE_NAME)
    except TracingConfigError as error:
        output.say(str(error), style="red", level=logging.ERROR)
        raise typer.Exit(2) from None
    atexit.register(tracing.shutdown)


@throttler_app.command()
def serve(
    dynamic_spec: Annotated[Path, typer.Option("--dynamic-spec", help="DynamicSpec file; its `throttlers` are served "
                                               "and re-read live.")],
    port: Annotated[int, typer.Option(help="TCP port (0 = a free one, printed at start).")] = 8089,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    reload_period: Annotated[float, typer.Option(help="Seconds between re-reads of the DynamicSpec file.")] = 1.0,
    state_file: Annotated[Optional[Path], typer.Option(  # noqa: UP045 - typer needs Optional
        help="File for the restart horizon: the first start is full and a restart resumes as soon as the "
             "envelope allows. Without it every start waits one lease and begins empty.")] = None,
    log_format: LogFormatOption = LogFormatChoice.text,
    log_level: LogLevelOption = LogLevelChoice.info,
    otlp_endpoint: Annotated[Optional[str], typer.Option(  # noqa: UP045 - typer needs Optional
        help="Send the controller's decisions as OpenTelemetry spans (service egress-throttler) to this "
             "OTLP/HTTP receiver (default: OTEL_EXPORTER_OTLP_ENDPOINT, else none); needs egress[tracing].")] = None,
    supervisor: Annotated[Optional[int], typer.Option(  # noqa: UP045 - typer needs Optional
        hidden=True, help="The pid of the egress run --processes that started this service: it stops when that "
                          "ends.")] = None,
) -> None:
    """Serve RequestQuota over HTTP/JSON (POST /v1/request_quota, GET /metrics, GET /healthz) until Ctrl-C."""
    from egress.throttler.service import ThrottlerService

    if supervisor is not None:
        from egress.cli.supervision import end_with

        end_with(supervisor)  # its SIGTERM stops the service as a Ctrl-C does

    output = start_output(console, log_format, log_level, "egress.throttler.serve")
    if otlp_endpoint is not None or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") \
            or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        _start_tracing(otlp_endpoint, output)
    try:
        service = ThrottlerService(dynamic_spec, RealClock(), host=host, port=port, reload_period=reload_period,
                                   state_file=state_file)
    except SpecError as error:
        output.say(error.format(), style="red", level=logging.ERROR)
        raise typer.Exit(2) from None

    async def main() -> None:
        url = await service.start()
        output.say(f"throttler service listening on {url} with throttlers "
                   f"{', '.join(service.controller.throttler_ids) or '(none)'}", url=url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await service.stop()

    try:
        asyncio.run(main())
    except OSError as error:  # the address: the DynamicSpec was read above
        output.say(cannot_listen(host, port, error, port_option="--port"), style="red", level=logging.ERROR)
        raise typer.Exit(1) from None
