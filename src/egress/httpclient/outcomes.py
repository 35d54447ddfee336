"""Why an HTTP attempt failed, as a type: the one place that maps a :class:`Response` (its status, or
libcurl's error code) to a :class:`FailureKind`.

The async HTTP sink uses it for its verdict on each attempt (success, redirect to follow, or a
failure whose pause and retry follow the sink's rules), for the ``error_class`` label of its
transport-error metric and for the status of each attempt in a dead-letter line; the batching HTTP
sink reuses it the same way. libcurl's error codes are its stable ABI (``curl/curl.h``,
``CURLcode``); the classes follow what an operator acts on: the endpoint answered (``status``), it
could not be reached (``resolve``, ``connect``), it was too slow (``timeout``), the connection broke
mid-exchange (``reset``), TLS refused it (``tls``), it spoke something else than HTTP/1.1
(``protocol``), or the sender stopped it (``closed``, ``redirect``, ``throttler``).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from egress.httpclient.curl import CLIENT_CLOSED, Response


class FailureKind(enum.StrEnum):
    """The class of a failed attempt (the ``error_class`` metric label)."""

    STATUS = "status"  # a complete response with a status other than 2xx
    RESOLVE = "resolve"  # the host (or proxy) name did not resolve
    CONNECT = "connect"  # no connection: refused, unreachable
    TIMEOUT = "timeout"  # the attempt's timeout ended it (connect, send, response or body)
    RESET = "reset"  # the connection broke: reset, closed early, nothing or part of a body received
    TLS = "tls"  # the TLS handshake or the certificate check failed
    PROTOCOL = "protocol"  # not a well-formed HTTP/1.1 exchange, or a URL libcurl refuses
    REDIRECT = "redirect"  # a redirect that cannot be followed (limit, Location, https -> http)
    THROTTLER = "throttler"  # the throttler controller stayed away past its retry budget
    CLOSED = "closed"  # the client was closed while the request waited or ran
    OTHER = "other"  # any other libcurl error, or an error without a code


# libcurl's CURLcode values (curl/curl.h) by class; a code not listed is OTHER.
CURL_ERROR_KINDS: dict[int, FailureKind] = {
    1: FailureKind.PROTOCOL,  # CURLE_UNSUPPORTED_PROTOCOL
    3: FailureKind.PROTOCOL,  # CURLE_URL_MALFORMAT
    5: FailureKind.RESOLVE,  # CURLE_COULDNT_RESOLVE_PROXY
    6: FailureKind.RESOLVE,  # CURLE_COULDNT_RESOLVE_HOST
    7: FailureKind.CONNECT,  # CURLE_COULDNT_CONNECT
    8: FailureKind.PROTOCOL,  # CURLE_WEIRD_SERVER_REPLY
    16: FailureKind.PROTOCOL,  # CURLE_HTTP2
    18: FailureKind.RESET,  # CURLE_PARTIAL_FILE: the body ended before its Content-Length
    28: FailureKind.TIMEOUT,  # CURLE_OPERATION_TIMEDOUT
    35: FailureKind.TLS,  # CURLE_SSL_CONNECT_ERROR
    47: FailureKind.REDIRECT,  # CURLE_TOO_MANY_REDIRECTS
    52: FailureKind.RESET,  # CURLE_GOT_NOTHING: closed without a response
    53: FailureKind.TLS,  # CURLE_SSL_ENGINE_NOTFOUND
    54: FailureKind.TLS,  # CURLE_SSL_ENGINE_SETFAILED
    55: FailureKind.RESET,  # CURLE_SEND_ERROR
    56: FailureKind.RESET,  # CURLE_RECV_ERROR (a reset connection among others)
    58: FailureKind.TLS,  # CURLE_SSL_CERTPROBLEM
    59: FailureKind.TLS,  # CURLE_SSL_CIPHER
    60: FailureKind.TLS,  # CURLE_PEER_FAILED_VERIFICATION: an unknown CA, a wrong host name
    64: FailureKind.TLS,  # CURLE_USE_SSL_FAILED
    66: FailureKind.TLS,  # CURLE_SSL_ENGINE_INITFAILED
    77: FailureKind.TLS,  # CURLE_SSL_CACERT_BADFILE
    80: FailureKind.TLS,  # CURLE_SSL_SHUTDOWN_FAILED
    82: FailureKind.TLS,  # CURLE_SSL_CRL_BADFILE
    83: FailureKind.TLS,  # CURLE_SSL_ISSUER_ERROR
    90: FailureKind.TLS,  # CURLE_SSL_PINNEDPUBKEYNOTMATCH
    91: FailureKind.TLS,  # CURLE_SSL_INVALIDCERTSTATUS
    92: FailureKind.PROTOCOL,  # CURLE_HTTP2_STREAM
    95: FailureKind.PROTOCOL,  # CURLE_HTTP3
    98: FailureKind.TLS,  # CURLE_SSL_CLIENTCERT
}


class AttemptFailure(NamedTuple):
    """Why one attempt failed, for every HTTP sink: its ``kind``, the HTTP ``status`` when a response
    arrived (0 when none did), libcurl's ``curl_code`` (0 when libcurl reported none) and the
    ``message`` the sink shows (``HTTP status 503``, ``curl error 28: Operation timed out``, ...; also
    ``str()``). A sink whose protocol names its errors gives the name as ``code`` (the Firehose
    sink's error-output codes) and marks a failure that no retry can mend ``permanent`` (its 413)."""

    kind: FailureKind
    message: str
    status: int = 0
    curl_code: int = 0
    code: str = ""
    permanent: bool = False

    def __str__(self) -> str:
        return self.message


def curl_error_kind(code: int) -> FailureKind:
    """The class of libcurl error ``code`` (a ``CURLcode``)."""
    return CURL_ERROR_KINDS.get(code, FailureKind.OTHER)


def failure_of(response: Response) -> AttemptFailure | None:
    """``None`` for a complete 2xx, else why the attempt failed. A transport error wins over a
    status that arrived before it (the body read failed): the exchange did not complete."""
    if response.error is not None:
        if response.curl_code:
            kind = curl_error_kind(response.curl_code)
        else:
            kind = FailureKind.CLOSED if response.error == CLIENT_CLOSED else FailureKind.OTHER
        return AttemptFailure(kind, response.error, response.status, response.curl_code)
    status = response.status
    if 200 <= status <= 299:
        return None
    return status_failure(status)


def status_failure(status: int) -> AttemptFailure:
    """An attempt failed by the HTTP ``status`` of a complete response."""
    return AttemptFailure(FailureKind.STATUS, f"HTTP status {status}", status)


def sender_failure(kind: FailureKind, message: str) -> AttemptFailure:
    """An attempt the sender itself ended (a redirect it will not follow, a throttler that stayed
    away, its own deadline)."""
    return AttemptFailure(kind, message)
