"""What a long-running command (``egress run``, ``egress receiver``, ``egress throttler serve``)
tells its user on stderr: rich lines for people (``--log-format text``, the default), or only log
records, one JSON object per line (``--log-format json``: ``egress.observe.logs``), so that every
line a run writes parses."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

import typer

from egress.observe.logs import LogFormat, add_secret, configure_logging, redact

if TYPE_CHECKING:
    from rich.console import Console, RenderableType


def command_group(**options: Any) -> typer.Typer:
    """A ``typer.Typer`` of egress's commands (``options`` as ``typer.Typer`` takes them) whose
    ``--help`` is click's plain text, not rich's panels: rich truncates an option's name and its
    type to fit 80 columns (``--no-until-drai…`` in a pipe) and reads ``[tracing]`` in a help text
    as markup and drops it."""
    return typer.Typer(rich_markup_mode=None, **options)


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


_stderr: Console | None = None


def stderr_console() -> Console:
    """The rich ``Console`` on standard error that commands print with, made on first use: a run that
    prints nothing for people (``--quiet``, ``--log-format json``) does not import rich."""
    global _stderr
    if _stderr is None:
        from rich.console import Console

        _stderr = Console(stderr=True, soft_wrap=True)
    return _stderr


class Output:
    """The command's voice: :meth:`say` prints a line (text) or logs a record (json) on ``console``'s
    stderr; without a ``console``, on :func:`stderr_console`'s, made when first printed to."""

    def __init__(self, console: Console | None = None, log_format: LogFormat = "text",
                 logger: str = "egress.cli") -> None:
        self._console = console
        self.json = log_format == "json"
        self.logger = logging.getLogger(logger)

    @property
    def console(self) -> Console:
        """The console this output prints to."""
        return self._console if self._console is not None else stderr_console()

    def say(self, text: str, *, style: str | None = None, level: int = logging.INFO, **fields: Any) -> None:
        """Tell ``text`` (secrets redacted), in ``style`` on a terminal; with ``fields`` as context in JSON."""
        if self.json:
            self.logger.log(level, text, extra={"fields": fields})
        elif style:
            from rich.text import Text

            self.console.print(Text(redact(text), style=style), highlight=False)
        else:
            self.console.print(redact(text), highlight=False)

    def show(self, renderable: Callable[[], RenderableType], text: str, **fields: Any) -> None:
        """Print what ``renderable()`` makes (a table) for people, or log ``text`` with ``fields`` in
        JSON (nothing is rendered then, and rich is not imported)."""
        if self.json:
            self.logger.info(text, extra={"fields": fields})
        else:
            self.console.print(renderable())


def start_output(console: Console | None, log_format: LogFormatChoice, log_level: LogLevelChoice, logger: str,
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
