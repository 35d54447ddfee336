"""What a long-running command (``egress run``, ``egress receiver``, ``egress throttler serve``)
tells its user on stderr: rich lines for people (``--log-format text``, the default), or only log
records, one JSON object per line (``--log-format json``: ``egress.observe.logs``), so that every
line a run writes parses."""

from __future__ import annotations

import enum
import logging
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer
from rich.console import Console, RenderableType
from rich.text import Text

from egress.observe.logs import LogFormat, add_secret, configure_logging, redact


class LogFormatChoice(enum.StrEnum):
    text = "text"
    json = "json"


class LogLevelChoice(enum.StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"
    critical = "critical"


LogFormatOption = Annotated[LogFormatChoice, typer.Option(
    "--log-format",
    help="text (lines for people) or json (every line a JSON object: time, level, logger, message and the "
         "context: pipeline, computation, partition, sink, message_id).")]
LogLevelOption = Annotated[LogLevelChoice, typer.Option(
    "--log-level", case_sensitive=False, help="The least severe log records written.")]


class Output:
    """The command's voice: :meth:`say` prints a line (text) or logs a record (json) on ``console``'s stderr."""

    def __init__(self, console: Console, log_format: LogFormat = "text", logger: str = "egress.cli") -> None:
        self.console = console
        self.json = log_format == "json"
        self.logger = logging.getLogger(logger)

    def say(self, text: str, *, style: str | None = None, level: int = logging.INFO, **fields: Any) -> None:
        """Tell ``text`` (secrets redacted), in ``style`` on a terminal; with ``fields`` as context in JSON."""
        if self.json:
            self.logger.log(level, text, extra={"fields": fields})
        else:
            self.console.print(Text(redact(text), style=style) if style else redact(text), highlight=False)

    def show(self, renderable: RenderableType, text: str, **fields: Any) -> None:
        """Print ``renderable`` (a table) for people, or log ``text`` with ``fields`` in JSON."""
        if self.json:
            self.logger.info(text, extra={"fields": fields})
        else:
            self.console.print(renderable)


def start_output(console: Console, log_format: LogFormatChoice, log_level: LogLevelChoice, logger: str,
                 urls: tuple[str, ...] = ()) -> Output:
    """Configure logging (``egress.observe.logs.configure_logging``) and return the command's :class:`Output`.
    The credentials in ``urls`` (``nats://user:password@host``, ``nats://token@host``) are never logged."""
    configure_logging(log_format.value, log_level.value)
    for url in urls:
        for server in url.split(","):
            parts = urlsplit(server.strip())
            add_secret(parts.password)
            if parts.password is None:
                add_secret(parts.username)  # a token alone in the user part
    return Output(console, log_format.value, logger)
