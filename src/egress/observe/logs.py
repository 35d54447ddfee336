"""Logs: one line per record on stderr, as text or JSON, carrying the record's context and no secret.

A JSON line is an object with ``time`` (RFC 3339, UTC, milliseconds), ``level`` (``debug`` …
``critical``), ``logger``, ``message``, then the context fields that are set: ``pipeline``,
``worker``, ``computation``, ``partition``, ``sink``, ``message_id`` (hex), and any other field a
record gives in ``extra={"fields": {...}}``; ``exception`` holds a traceback. The context comes from
:func:`log_context` (a ``contextvars`` variable: asyncio tasks inherit it, so every log call in a
partition job's task carries its computation and partition) and from the record's own fields,
which win.

Secrets never reach a line: every value :func:`add_secret` registered (access keys, bearer tokens,
values of credential headers, NATS passwords; :func:`secrets_of_spec` finds those of a Spec) is
replaced by ``***`` in the message, the fields and the traceback, and so are the password of a URL
(``nats://user:***@host``) and the value of an ``Authorization`` header in any text.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TextIO

import orjson

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
CONTEXT_FIELDS = ("pipeline", "worker", "computation", "partition", "sink", "message_id")
REDACTED = "***"
# Shorter values would redact ordinary words; a credential is longer than this.
MIN_SECRET_LENGTH = 4
# Header names whose values are credentials (RFC 9110 §11.6.2, §11.7.2; the common API key headers).
SECRET_HEADER = re.compile(r"authorization|cookie|token|secret|password|api[-_]?key|access[-_]?key|credential",
                           re.IGNORECASE)

_NO_CONTEXT: Mapping[str, Any] = MappingProxyType({})
_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar("egress_log_context", default=_NO_CONTEXT)
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^/@:\s]*:)[^/@\s]+@")
_AUTHORIZATION = re.compile(r"(?P<head>(?:proxy-)?authorization\s*[:=]\s*(?:(?:bearer|basic|token)\s+)?)[^\s,;'\"]+",
                            re.IGNORECASE)


class _Secrets:
    """The secret values of this process, longest first (a secret containing another one is
    replaced whole)."""

    def __init__(self) -> None:
        self._values: list[str] = []

    def add(self, value: str | None) -> None:
        if value is None:
            return
        value = value.strip()
        if len(value) >= MIN_SECRET_LENGTH and value not in self._values:
            self._values = sorted([*self._values, value], key=len, reverse=True)

    def redact(self, text: str) -> str:
        for value in self._values:
            if value in text:
                text = text.replace(value, REDACTED)
        text = _URL_PASSWORD.sub(rf"\g<head>{REDACTED}@", text)
        return _AUTHORIZATION.sub(rf"\g<head>{REDACTED}", text)


_SECRETS = _Secrets()


def add_secret(value: str | None) -> None:
    """Never log ``value`` (stripped; ignored when shorter than :data:`MIN_SECRET_LENGTH`)."""
    _SECRETS.add(value)


def redact(text: str) -> str:
    """``text`` with every registered secret, URL password and ``Authorization`` value replaced by ``***``."""
    return _SECRETS.redact(text)


def secrets_of_spec(document: Any, base_dir: Path | None = None) -> list[str]:
    """The secret values a Spec (as loaded: dicts and lists; relative paths from ``base_dir``) refers
    to, wherever they are: the value of every environment variable a ``*_env`` key (or the ``env``
    of an ``access_key``) names; the content, whole and line by line, of a file a credential's
    ``*_file`` key (``bearer_token_file``, ``credentials_file``) or an ``access_key``'s ``file``
    names; and the value of every header whose name is a credential's (:data:`SECRET_HEADER`)."""
    found: list[str] = []
    _collect_secrets(document, found, "", base_dir or Path.cwd())
    return found


def _collect_secrets(node: Any, found: list[str], parent: str, base_dir: Path) -> None:
    if isinstance(node, list):
        for item in node:
            _collect_secrets(item, found, parent, base_dir)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if isinstance(value, str):
            if key.endswith("_env") or (key == "env" and parent == "access_key"):
                found.append(os.environ.get(value, ""))
            elif (key == "file" and parent == "access_key") or (key.endswith("_file") and SECRET_HEADER.search(key)):
                found.extend(_file_secrets(base_dir / value))
            elif parent == "headers" and SECRET_HEADER.search(key):
                found.append(value)
        else:
            _collect_secrets(value, found, key, base_dir)


def _file_secrets(path: Path) -> list[str]:
    """The text of ``path`` and each of its lines (none when it cannot be read: the connector says so)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [text, *text.splitlines()]


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Add ``fields`` (names of :data:`CONTEXT_FIELDS` or others) to every record logged inside,
    and in the asyncio tasks created inside."""
    token = _context.set({**_context.get(), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def bind_log_context(**fields: Any) -> None:
    """Add ``fields`` to every record logged from now on in this context (a command's whole run:
    ``pipeline``, ``worker``), and in the asyncio tasks created after."""
    _context.set({**_context.get(), **fields})


def unit_context(consumer: str, partition: int) -> contextvars.Context:
    """A copy of the current context with ``consumer`` (a computation, or ``source:<id>``) and
    ``partition`` set: the context a unit's task runs in (``asyncio.create_task(..., context=)``)."""
    context = contextvars.copy_context()
    context.run(_context.set, {**_context.get(), "computation": consumer, "partition": partition})
    return context


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The context of ``record``: the log context when it was made, then its own ``fields``."""
    fields = dict(getattr(record, "egress_context", None) or {})
    fields.update(getattr(record, "fields", None) or {})
    message_id = fields.get("message_id")
    if isinstance(message_id, bytes):
        fields["message_id"] = message_id.hex()
    return fields


class _ContextFilter(logging.Filter):
    """Takes the log context into the record when it is made (the handler may format it later)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "egress_context"):
            record.egress_context = _context.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module docs), secrets redacted."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        for name, value in record_fields(record).items():
            entry.setdefault(name, _redacted_value(value))
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> [field=value ...]``, secrets redacted."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{name}={_text(value)}" for name, value in record_fields(record).items())
        line = f"{_rfc3339(record.created)} {record.levelname} {record.name}: {redact(record.getMessage())}"
        if fields:
            line += f" [{fields}]"
        if record.exc_info:
            line += "\n" + redact(self.formatException(record.exc_info))
        return line


def _redacted_value(value: Any) -> Any:
    """``value`` as JSON can carry it (nested dicts and lists kept), every string redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, bool | int | float) or value is None:
        return value
    if isinstance(value, dict):
        return {str(key): _redacted_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted_value(item) for item in value]
    return redact(str(value))


def _text(value: Any) -> str:
    redacted = _redacted_value(value)
    return redacted if isinstance(redacted, str) else orjson.dumps(redacted).decode()


def _rfc3339(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


_installed: logging.Handler | None = None  # the handler of the last configure_logging


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes (as logging's last resort does)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def configure_logging(log_format: LogFormat = "text", level: str = "info", *, stream: TextIO | None = None,
                      secrets: Iterable[str | None] = ()) -> logging.Handler:
    """Send every record of ``level`` and above (a name of :data:`LOG_LEVELS`) to ``stream``
    (stderr) in ``log_format``, replacing the handler an earlier call installed; Python warnings are logged
    too. ``secrets`` are registered first (:func:`add_secret`). Returns the handler. Raises
    ``ValueError`` for an unknown format or level."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: use one of {', '.join(LOG_FORMATS)}")
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LOG_LEVELS)}")
    for secret in secrets:
        add_secret(secret)
    global _installed
    handler: logging.Handler = logging.StreamHandler(stream) if stream is not None else _CurrentStderr()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(_ContextFilter())
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    root.addHandler(handler)
    _installed = handler
    root.setLevel(level.upper())
    logging.captureWarnings(True)
    return handler
