"""Errors of the Firehose layer: what a receiver's handler raises, and what a request is rejected with."""

from __future__ import annotations

from egress.errors import EgressError


class FirehoseError(EgressError):
    """Base class of the errors raised by :mod:`egress.firehose`."""


class PermanentError(FirehoseError):
    """Raised by a receiver handler when the records can never be accepted (bad content).

    The receiver answers 400 with ``str(error)`` as ``errorMessage``; Firehose retries every status
    except 413 until its retry duration runs out (Firehose HTTP endpoint spec, "Handling error
    responses"), so a sender keeps retrying a 400 too; use it for content a retry cannot fix.
    """


class TransientError(FirehoseError):
    """Raised by a receiver handler when the records could not be stored now but may be later.

    The receiver answers 503 with ``str(error)`` as ``errorMessage``; the sender retries with backoff.
    """


class RequestRejected(FirehoseError):
    """A request fails a rule of the receiver's decision table.

    ``status`` is the HTTP status to answer (400, 401, 404, 405, 413, 415; 499 when the client left
    mid-body, counted but never sent) and ``message`` the
    ``errorMessage`` of the JSON response body (``docs/firehose.md``, "Receiver decision table").
    """

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"{status}: {message}")


class ResponseNotAccepted(FirehoseError):
    """A sender got a response that is not a conforming success (not 200, wrong body, ...).

    ``status`` is the HTTP status received (0 when no response arrived), ``reason`` says which rule
    failed and ``body`` is the response body (possibly truncated). Firehose treats every such
    response as a 500 without body (Firehose HTTP endpoint spec, "Response format").
    """

    def __init__(self, status: int, reason: str, body: bytes = b"") -> None:
        self.status = status
        self.reason = reason
        self.body = body
        super().__init__(f"{status}: {reason}")
