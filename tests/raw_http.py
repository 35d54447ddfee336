"""HTTP/1.1 requests written by hand on a raw socket, in pieces, as real clients send them.

Blocking sockets: run these in a thread (``asyncio.to_thread``) when the server runs in the
test's event loop. The answer is parsed by ``http.client`` (one response, read whole).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ANSWER_TIMEOUT = 30.0
"""Seconds a test waits for an answer: a failure guard only, never a condition of passing."""


@dataclass(frozen=True)
class Answer:
    """``status``, ``headers`` (lower-cased names) and the whole ``body`` of one response."""

    status: int
    headers: dict[str, str]
    body: bytes


def head(path: str, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """A POST's request line and headers (``Host``; ``headers`` as given, framing included), ending
    with the empty line."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{name}: {value}" for name, value in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def with_length(path: str, body: bytes, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """A whole request framed by ``Content-Length``."""
    return head(path, [*headers, ("Content-Length", str(len(body)))]) + body


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (RFC 9112 7.1); ``b""`` gives the last chunk and the end."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n" + (b"\r\n" if not data else b"")


def chunked_head(path: str, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    return head(path, [*headers, ("Transfer-Encoding", "chunked")])


def connect(port: int) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each write its own segment
    return connection


def read_answer(connection: socket.socket) -> Answer:
    """The one response on ``connection`` (raises ``TimeoutError`` after :data:`ANSWER_TIMEOUT`)."""
    response = http.client.HTTPResponse(connection)
    response.begin()
    body = response.read()
    return Answer(response.status, {name.lower(): value for name, value in response.getheaders()}, body)


def send_in_pieces(port: int, pieces: Sequence[bytes], pause: float = 0.0) -> Answer:
    """Write ``pieces`` one after another on a new connection, ``pause`` seconds apart, then read
    the answer. The pause only makes the pieces likely to arrive apart; a test asserts on the answer."""
    with connect(port) as connection:
        for number, piece in enumerate(pieces):
            if number and pause:
                time.sleep(pause)
            connection.sendall(piece)
        return read_answer(connection)


def wait_closed(connection: socket.socket) -> None:
    """Return once the server has closed ``connection`` (after the answer, nothing more comes)."""
    assert connection.recv(1) == b"", "the server sent more after its answer"


def refused_while_sending(port: int, start: bytes, pieces: Iterable[bytes]) -> Answer:
    """Write ``start`` then ``pieces`` from a thread while reading the answer, as a client that does
    not wait for an answer before sending its whole body: the answer of a server that refuses the
    body before its end, returned once the server has closed the connection (what is left of the
    body is sent meanwhile, or given up once the server stops reading)."""

    def write() -> None:
        with contextlib.suppress(OSError):  # the server closed the connection: the answer is what counts
            connection.sendall(start)
            for piece in pieces:
                connection.sendall(piece)

    with connect(port) as connection:
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        try:
            answer = read_answer(connection)
            wait_closed(connection)
            return answer
        finally:
            connection.shutdown(socket.SHUT_RDWR)  # a writer still blocked gives up
            writer.join(ANSWER_TIMEOUT)
