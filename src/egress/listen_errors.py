"""Why a server could not listen on its address: the one classification of a bind's ``OSError``,
for every part that listens (the http source, ``egress run --http-port``, the receivers, the
throttler's controller), each of which words the fix in its own terms (an option, a Spec path)."""

from __future__ import annotations

import errno
from typing import Literal, NamedTuple

BindFailureKind = Literal["in use", "permission", "address"]


class BindFailure(NamedTuple):
    """``kind``: ``"in use"`` (another socket holds the port), ``"permission"`` (a port below 1024
    without the right to bind it) or ``"address"`` (the host is not an address of this machine, or
    any other reason); ``reason``: the system's words, lowercased, without the address asyncio
    repeats in front of them."""

    kind: BindFailureKind
    reason: str


def bind_failure(error: OSError) -> BindFailure:
    """The :class:`BindFailure` of ``error``, raised by a bind (``socket.bind``, asyncio's
    ``create_server``, aiohttp's sites)."""
    reason = (error.strerror or str(error)).lower()
    if reason.startswith("error while attempting to bind"):  # asyncio's wording repeats the address
        reason = reason.rsplit("): ", 1)[-1]
    if "address already in use" in reason or error.errno == errno.EADDRINUSE:
        return BindFailure("in use", "address already in use")
    if error.errno == errno.EACCES:
        return BindFailure("permission", reason)
    return BindFailure("address", reason)


__all__ = ["BindFailure", "BindFailureKind", "bind_failure"]
