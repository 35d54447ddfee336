"""The exception hierarchy of egress.

Every error egress raises on purpose derives from :class:`EgressError`, so a caller can catch
one type. The shape follows httpx: a small tree, named by what went wrong, not by where::

    EgressError
    ├── SpecError                 a Spec or DynamicSpec is invalid (file, path, fix)
    │   ├── SpecErrors            several found in one pass
    │   ├── SpecMismatchError     the Spec's layout is not the state directory's (also a StateDirectoryError)
    │   └── ClusterSpecError      a worker's Spec is not its cluster's live members' (egress.runtime.cluster.worker)
    ├── StateDirectoryError       the state directory cannot be used (busy, another pipeline, unknown version)
    │   └── StateDirectoryFullError  its filesystem is full (raised by egress.engines.storage_errors)
    ├── SourceDataError           a source record does not fit the stream schema (file, line, column)
    ├── SourceChangedError        a source's input is not the one its committed position was read from
    ├── NatsSourceError           the nats source cannot reach its server or stream (egress.connectors.sources.nats)
    ├── NatsUnreachableError      no NATS server answered a first connection within connect_timeout
    │                             (egress.nats_connections); each user raises its own error from it
    ├── HttpSourceError           the http source cannot listen or read its token (egress.connectors.sources.http)
    ├── RequestBodyError          a request body refused before it was read whole (egress.http_body); its status:
    │   ├── BodyTooLargeError     413
    │   ├── BodyTimeoutError      408
    │   ├── UnreadableBodyError   400
    │   │   └── IncompleteBodyError  the client's FIN came before the body's end
    │   └── ClientClosedError     499
    ├── ProcessFunctionError      a process function raised (stream, key, message id)
    │   └── RowEncodingError      an emitted value cannot be stored (computation, stream, column, id)
    ├── DeliveryError             a delivery's retry budget is exhausted
    ├── RedirectError             a Location cannot be followed (egress.httpclient.redirects; also a ValueError)
    ├── SecretUnavailable         the variable or file a secret's reference names cannot be read
    │   │                         (egress.secret_references)
    │   └── AccessKeyUnavailable  a firehose_http sink's access key cannot be read or has not its form
    │                             (egress.connectors.sinks.firehose_parameters)
    ├── FencedError               a commit carried a lease that is no longer the owner's
    ├── EngineUnavailableError    an engine's server gave no usable answer within its outage timeout (retryable)
    │   ├── NatsUnavailableError  the NATS engine's outage (egress.engines.nats)
    │   └── MembershipLostError   a cluster worker could not renew its membership (egress.runtime.cluster.worker)
    ├── NatsEngineError           the NATS engine cannot reach or use its server (egress.engines.nats)
    │   └── JetStreamRequestError the server refused a request (its err_code)
    ├── DuplicateWorkerError      another live process runs under a worker id (egress.runtime.cluster.duplicates)
    ├── LineFileBusy              another process holds a line file exclusively (egress.line_files)
    ├── DeadLetterFileError       a dead-letter file cannot be read or written (egress.connectors.dead_letters)
    ├── RedriveError              egress redrive cannot start (egress.runtime.redrive)
    ├── StatusUnavailable         a status endpoint did not answer with /status JSON (egress.cli.status)
    ├── TracingConfigError        tracing cannot start: a sampler or endpoint it does not know, no extra installed
    ├── ThrottlerError            a throttler cannot grant a quota (egress.throttler.errors)
    │   ├── QuotaAmountError      a negative or non-finite amount (also a ValueError)
    │   ├── UnknownThrottlerError no throttler of that id (also a KeyError)
    │   ├── ThrottlerNotConfiguredError  the name is not configured for this client
    │   ├── ControllerUnavailableError   the controller did not answer (retried by the client)
    │   ├── ControllerClosedError the controller stopped
    │   ├── QuotaRequestFailedError      failed for good: past the retry budget, or rejected
    │   ├── ThrottleInterruptedError     the job stops while a call waits for quota
    │   ├── RequestWithdrawnError its client asked again or gave up
    │   └── BadRequestError       a RequestQuota body that is not a quota call (egress.throttler.wire)
    └── FirehoseError             the Firehose layer (egress.firehose.errors)
        ├── PermanentError        a handler's records can never be accepted (400)
        │   └── CloudWatchLogsDecodeError  a CloudWatch Logs subscription record does not decode
        ├── TransientError        a handler's records could not be stored now (503)
        ├── RequestRejected       a request fails a rule of the receiver's decision table
        └── ResponseNotAccepted   a sender got a response that is not a conforming success

A class with two bases in the tree says "also a" the second. A built-in base is part of the public
API where a process function may catch it as Python's own: a negative quota amount is a
``ValueError`` and an unknown throttler name a ``KeyError``, as for ``float`` and ``dict``.

``tests/unit/test_errors.py`` checks that this tree and the code agree, class by class and parent by parent.
"""

from __future__ import annotations

import re

_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Control characters (C0, DEL, C1) and the Unicode line and paragraph separators: a terminal acts on
them or breaks a line there."""


def printable(text: str) -> str:
    """``text`` with every control character and line separator written as its Python escape
    (``\\n``, ``\\x1b``): a message that quotes user input stays one line and cannot drive a terminal."""
    return _UNPRINTABLE.sub(lambda found: repr(found.group())[1:-1], text)


class EgressError(Exception):
    """Base class of every error egress raises deliberately."""


class SpecError(EgressError):
    """A Spec or DynamicSpec is invalid.

    ``file`` is the file the value came from (``None`` for in-memory specs), ``path`` the
    slash-separated location inside it (``computations/to_json/sinks/http/parameters/url``) and
    ``message`` what is wrong and how to fix it. ``str()`` gives the one-line form
    ``FILE: PATH: MESSAGE`` that the CLI prints.
    """

    def __init__(self, message: str, *, path: str = "", file: str | None = None) -> None:
        self.message = message
        self.path = path
        self.file = file
        super().__init__(self.format())

    def format(self) -> str:
        """``FILE: PATH: MESSAGE`` on one line (control characters escaped: see :func:`printable`)."""
        parts = [p for p in (self.file, self.path) if p]
        return printable(": ".join([*parts, self.message]))

    def at(self, *, file: str | None = None, prefix: str = "") -> SpecError:
        """Return a copy located in ``file`` with ``prefix`` put before the path."""
        path = "/".join(p for p in (prefix, self.path) if p)
        return SpecError(self.message, path=path, file=file if file is not None else self.file)


SHOWN_PROBLEMS = 50
"""How many problems :meth:`SpecErrors.format` gives a line each: past them a file (one generated
wrong, say) would bury the first under thousands of lines, and each costs time and memory."""


class SpecErrors(SpecError):
    """Several :class:`SpecError` found in one validation pass; ``errors`` lists them in order."""

    def __init__(self, errors: list[SpecError]) -> None:
        self.errors = errors
        first = errors[0]
        super().__init__(first.message, path=first.path, file=first.file)

    def format(self) -> str:
        """One line per problem (:meth:`SpecError.format`), the first :data:`SHOWN_PROBLEMS` of
        them, then, when there are more, ``FILE: … and N more problems: ...`` naming the files
        they are in."""
        lines = [error.format() for error in self.errors[:SHOWN_PROBLEMS]]
        rest = self.errors[SHOWN_PROBLEMS:]
        if rest:
            files = ", ".join(dict.fromkeys(error.file for error in rest if error.file))
            lines.append(printable(f"{files + ': ' if files else ''}… and {len(rest)} more "
                                   f"problem{'s' if len(rest) > 1 else ''}: fix these and check again to see them"))
        return "\n".join(lines)


class SourceDataError(EgressError):
    """A source record cannot be converted to the stream schema.

    The message names the file, the line (1-based, the header is line 1) and the column.
    """


class SourceChangedError(EgressError):
    """A source's input no longer holds what its committed position was read from (a file replaced
    or shortened between runs), so resuming would skip or repeat records. Raised when the source
    starts reading; the message names the file, what changed and the fix."""


class ProcessFunctionError(EgressError):
    """A user process function raised; the message names the stream, key and message id."""


class RowEncodingError(ProcessFunctionError):
    """An emitted row holds a value that cannot be stored (raised when its epoch commits, or by
    ``egress.testing`` when the function emits it). The message names the computation (or source),
    the stream, the column and the message id; ``stream``, ``column`` and ``message_id`` hold them."""

    def __init__(self, message: str, *, stream: str, column: str, message_id: bytes) -> None:
        self.stream = stream
        self.column = column
        self.message_id = message_id
        super().__init__(message)


class DeliveryError(EgressError):
    """A delivery to an external system failed terminally (its retry budget is exhausted)."""

    def __init__(self, message: str, *, attempts: int = 0, last_error: str | None = None) -> None:
        self.attempts = attempts
        self.last_error = last_error
        detail = f" after {attempts} attempt(s)" if attempts else ""
        cause = f"; last error: {last_error}" if last_error else ""
        super().__init__(f"{message}{detail}{cause}")


class StateDirectoryError(EgressError):
    """The state directory belongs to another pipeline or has an unknown layout version."""


class StateDirectoryFullError(StateDirectoryError):
    """The state directory's filesystem is full (SQLite's ``SQLITE_FULL`` or ``ENOSPC``): raised by the
    storage engine when a write finds no space. The transaction that needed it was rolled back, so
    everything committed before is kept; free space (``needed_bytes`` at least; ``free_bytes`` were
    free when it was raised) or move the directory, and run again: the run resumes from its last
    commit. ``str()`` is one line naming the directory and both sizes."""

    def __init__(self, state_dir: str, *, free_bytes: int, needed_bytes: int) -> None:
        self.state_dir = state_dir
        self.free_bytes = free_bytes
        self.needed_bytes = needed_bytes
        mebibyte = 1024 * 1024
        super().__init__(
            f"{state_dir}: the state directory's filesystem is full ({free_bytes / mebibyte:.1f} MiB free): "
            f"free at least {needed_bytes / mebibyte:.1f} MiB there (or move the directory) and run again; "
            "everything committed is kept and the run resumes from it")


class SpecMismatchError(SpecError, StateDirectoryError):
    """The Spec no longer matches what the state directory's committed data depends on.

    Raised by ``Pipeline.run()`` before anything starts (nothing in the directory is changed), and
    by ``egress validate --state-dir``; also when the directory belongs to another pipeline (``path``
    ``pipeline``: the engine's ``open()`` raises it without ``file``). ``path`` is the Spec path that
    changed (``partition_count``, ``streams/flights/group_by``, ...; empty when the directory recorded
    no Spec and holds committed messages this Spec cannot reach) and ``state_dir`` the directory. ``str()`` is one line:
    ``FILE: state directory DIR was written with PATH OLD; the Spec now says NEW: what to do``.
    """

    def __init__(self, message: str, *, path: str = "", file: str | None = None, state_dir: str = "") -> None:
        self.state_dir = state_dir
        super().__init__(message, path=path, file=file)

    def format(self) -> str:
        return ": ".join(part for part in (self.file, self.message) if part)  # the message names the path

    def in_file(self, file: str | None) -> SpecMismatchError:
        """A copy naming the Spec ``file`` (an engine that finds the mismatch does not know it)."""
        return SpecMismatchError(self.message, path=self.path, file=file, state_dir=self.state_dir)


class FencedError(EgressError):
    """A commit carried a lease that is no longer the owner's (another process took the consumer
    partition over): nothing of it is stored. Raised by an engine's ``commit``; the job that met
    it stops, and its unit runs again wherever the lease now is."""


class SecretUnavailable(EgressError):
    """The environment variable a secret's reference names is not set, or the file it names cannot
    be read (``egress.secret_references.read_secret``), or what it holds has not the secret's form
    (raised by the component that reads it). ``where`` says which variable or file; the message
    never holds the secret. Fix the variable or the file, or the reference in the Spec."""

    def __init__(self, where: str, problem: str) -> None:
        self.where, self.problem = where, problem
        super().__init__(f"{where} {problem}")


class TracingConfigError(EgressError):
    """Tracing was asked for and cannot start (``egress.observe.tracing.configure``): an
    ``OTEL_TRACES_SAMPLER`` or ``OTEL_TRACES_SAMPLER_ARG`` egress does not know, an endpoint that is
    not an http(s) URL, or the ``egress[tracing]`` extra not installed. The message names the fix."""


class EngineUnavailableError(EgressError):
    """The engine's server gave no usable answer for longer than the engine's outage timeout.
    Retryable: what was committed stays committed, and an operation that raised it took effect
    whole or not at all. A cluster worker stops only the job that met it (the unit is taken again
    once the server answers), unless its own membership could not be renewed that long."""
