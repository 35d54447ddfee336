"""``RequestQuota`` as JSON, the same over HTTP (``egress throttler serve``) and over NATS.

A request is ``{"throttler_id", "client_id", "amount", "timestamp", "quota_class_id", "hold"}``
(NATS adds ``"rpc_timeout"``: the seconds after which the caller gives up, so the controller
cancels and refunds it then; and ``"request_id"``: the same for every attempt of one request, so a
copy still waiting when its client asks again is withdrawn). A client that gives a request up
sends ``{"withdraw": request_id}`` (NATS: no reply). An answer is ``{"amount", "lease", "waited"}`` (units granted,
seconds left of their lease when the controller replied, seconds the controller held the
request) or ``{"error", "code"}`` with ``code`` ``unknown_throttler``, ``invalid_amount``,
``bad_request``, ``withdrawn`` (the client asked again or gave up: nobody waits for it) or
``unavailable`` (the controller is closing: the client retries).
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import orjson

from egress.clock import Clock
from egress.throttler.controller import Grant, ThrottlerController
from egress.throttler.errors import (
    ControllerUnavailableError,
    QuotaAmountError,
    QuotaRequestFailedError,
    RequestWithdrawnError,
    ThrottlerError,
    UnknownThrottlerError,
)


class QuotaCall(NamedTuple):
    """One decoded ``RequestQuota`` (``rpc_timeout`` ``None`` when the request has none)."""

    throttler_id: str
    amount: float
    timestamp: float
    quota_class_id: str | None
    client_id: str
    hold: float
    rpc_timeout: float | None
    request_id: str = ""


class BadRequestError(ThrottlerError):
    """A ``RequestQuota`` body that is not the JSON object :data:`QuotaCall` describes."""


def encode_call(throttler_id: str, amount: float, *, timestamp: float, quota_class_id: str | None, client_id: str,
                hold: float, rpc_timeout: float | None = None, request_id: str = "") -> bytes:
    """The JSON body of one ``RequestQuota``."""
    body: dict[str, Any] = {"throttler_id": throttler_id, "client_id": client_id, "amount": amount,
                            "timestamp": timestamp, "quota_class_id": quota_class_id, "hold": hold}
    if rpc_timeout is not None:
        body["rpc_timeout"] = rpc_timeout
    if request_id:
        body["request_id"] = request_id
    return orjson.dumps(body)


def encode_withdrawal(request_id: str) -> bytes:
    """The JSON body saying the client gave request ``request_id`` up: ``{"withdraw": id}``."""
    return orjson.dumps({"withdraw": request_id})


def withdrawn_id(data: bytes) -> str | None:
    """The request id of a withdrawal body, ``None`` for any other body."""
    if b'"withdraw"' not in data:
        return None
    with contextlib.suppress(orjson.JSONDecodeError):
        body = orjson.loads(data)
        if isinstance(body, dict) and isinstance(body.get("withdraw"), str):
            return str(body["withdraw"])
    return None


def decode_call(data: bytes) -> QuotaCall:
    """The :class:`QuotaCall` of a JSON body; raises :class:`BadRequestError` saying what is wrong."""
    try:
        body = orjson.loads(data)
        class_id = body.get("quota_class_id")
        timeout = body.get("rpc_timeout")
        return QuotaCall(str(body["throttler_id"]), float(body["amount"]), float(body.get("timestamp") or 0.0),
                         None if class_id is None else str(class_id), str(body.get("client_id") or ""),
                         float(body.get("hold") or 0.0), None if timeout is None else float(timeout),
                         str(body.get("request_id") or ""))
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as error:
        raise BadRequestError(f"malformed RequestQuota: {error}") from None


async def answer_call(controller: ThrottlerController, call: QuotaCall, arrived: float) -> tuple[bool, dict[str, Any]]:
    """Ask ``controller`` for ``call`` (arrived at ``arrived``, the controller's monotonic seconds);
    returns ``(granted, answer)``: the grant's ``{"amount", "lease", "waited"}`` or the error's
    ``{"error", "code"}``. Cancelling it cancels (and refunds) the request."""
    try:
        grant = await controller.request_quota(call.throttler_id, call.amount, timestamp=call.timestamp,
                                               quota_class_id=call.quota_class_id, client_id=call.client_id,
                                               hold=call.hold, request_id=call.request_id)
    except UnknownThrottlerError as error:
        return False, {"error": str(error), "code": "unknown_throttler"}
    except QuotaAmountError as error:
        return False, {"error": str(error), "code": "invalid_amount"}
    except RequestWithdrawnError as error:
        return False, {"error": str(error), "code": "withdrawn"}
    except ThrottlerError as error:
        return False, {"error": str(error), "code": "unavailable"}
    now = controller.clock.monotonic()
    return True, {"amount": grant.amount, "lease": grant.until - now, "waited": now - arrived}


def decode_answer(payload: bytes) -> dict[str, Any]:
    """The answer object of a reply body (a body that is not one becomes ``{"error": <its start>}``)."""
    try:
        answer = orjson.loads(payload)
        if not isinstance(answer, dict):
            raise TypeError("not an object")
    except (orjson.JSONDecodeError, TypeError):
        answer = {"error": payload[:200].decode(errors="replace")}
    return answer


def raise_refusal(answer: dict[str, Any], where: str, *, unavailable: bool = False) -> None:
    """Raise the error of a refusing answer: :class:`ControllerUnavailableError` when ``unavailable``
    or its code says so (the client retries), else the controller's own error (upstream text)."""
    message, code = str(answer.get("error", "")), answer.get("code")
    if unavailable or code in ("unavailable", "withdrawn"):
        raise ControllerUnavailableError(f"{where}: {message}")
    if code == "unknown_throttler":
        raise UnknownThrottlerError(message)
    if code == "invalid_amount":
        raise QuotaAmountError(message)
    raise QuotaRequestFailedError(f"{where}: {message}")


def grant_of(answer: dict[str, Any], amount: float, sent: float, clock: Clock) -> Grant:
    """The :class:`Grant` of a granting answer to a request sent at ``sent`` (``clock.monotonic()``):
    the reply travelled at most the round trip less ``waited``, so the deadline ``arrival + lease −
    (round trip − waited)`` is never later than the lease the controller counted, whatever the two
    processes' clocks say."""
    arrived = clock.monotonic()
    granted = float(answer.get("amount", amount))
    lease, waited = float(answer.get("lease") or 0.0), float(answer.get("waited") or 0.0)
    return Grant(granted, arrived + lease - max(0.0, (arrived - sent) - waited))
