"""End to end: a ``nats`` source whose server cannot be reached. The first connection fails within
``connect_timeout`` with one line naming the fix; a stop (SIGTERM) ends the run while it is still
connecting, and while it waits for a lost server to come back; the loss is logged once, quietly.

Real processes: ``egress run`` and, for the lost server, a real nats-server SIGKILLed under it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import nats
import pytest

from tests.conftest import pass_through_spec
from tests.e2e.conftest import REPO, Receiver
from tests.nats_server import NatsServer
from tests.receiver_record import recorded_count
from tests.waiting import eventually_sync, exited

pytestmark = pytest.mark.e2e

GUARD = 60.0
"""Seconds a process gets to do what is awaited before the test fails (a failure guard, never a wait)."""
CONNECT_TIMEOUT = 1.0
START_MARGIN = 30.0
"""Seconds beyond ``connect_timeout`` a failing run may take: a Python process starting on a loaded machine."""


class RunUnderTest(NamedTuple):
    stream: str
    process: subprocess.Popen[bytes]
    log: Path


def closed_port_url() -> str:
    """A loopback URL nobody listens on (the port was bound once, then closed: connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"nats://127.0.0.1:{probe.getsockname()[1]}"


def nats_spec(directory: Path, url: str, stream: str, receiver_url: str, connect_timeout: float) -> Path:
    return pass_through_spec(directory / "spec.yaml", "unreachable", {
        "source_class_name": "nats",
        "parameters": {"url": url, "stream": stream, "connect_timeout": connect_timeout}}, receiver_url)


def start_run(directory: Path, spec: Path, *options: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = directory / "run.log"
    with log.open("wb") as output:
        process = subprocess.Popen([sys.executable, "-m", "egress", "run", str(spec), "--state-dir",
                                    str(directory / "state"), "--quiet", *options],
                                   cwd=REPO, stdout=output, stderr=subprocess.STDOUT)
    return process, log


def wait_for_line(log: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    """Return once a line of ``log`` holds ``text``; fail if the process exits first or within :data:`GUARD`."""
    try:
        eventually_sync(lambda: text in log.read_text(errors="replace"), what=f"egress run logging {text!r}",
                        timeout=GUARD, interval=0.05, unless=exited(process, log),
                        details=lambda: log.read_text()[-4000:])
    except AssertionError:
        process.kill()
        process.wait()
        raise


def exit_code(process: subprocess.Popen[bytes], log: Path) -> int:
    try:
        return process.wait(timeout=GUARD)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"egress run did not exit within {GUARD:g} s:\n{log.read_text()[-4000:]}")


def test_a_server_that_cannot_be_reached_fails_the_run_within_connect_timeout_in_one_line(tmp_path: Path) -> None:
    url = closed_port_url()
    spec = nats_spec(tmp_path, url, "ORDERS", "http://127.0.0.1:9/events", CONNECT_TIMEOUT)
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "egress", "run", str(spec), "--state-dir", str(tmp_path / "state"),
                          "--until-drained", "--quiet"], cwd=REPO, capture_output=True, text=True,
                         timeout=CONNECT_TIMEOUT + START_MARGIN, check=False)
    elapsed = time.monotonic() - started
    assert run.returncode == 1, run.stderr
    assert run.stderr.splitlines() == [
        f"error: nats source 'input': cannot connect to {url} within {CONNECT_TIMEOUT:g} s (ConnectionRefusedError: "
        f"[Errno 111] Connect call failed ('127.0.0.1', {url.rsplit(':', 1)[1]})): start the server or fix "
        "parameters/url"], run.stderr
    print(f"exited after {elapsed:.1f} s")  # connect_timeout plus the start of a Python process


def test_sigterm_while_the_first_connection_is_tried_ends_the_run_at_once(tmp_path: Path) -> None:
    spec = nats_spec(tmp_path, closed_port_url(), "ORDERS", "http://127.0.0.1:9/events", connect_timeout=3600)
    process, log = start_run(tmp_path, spec, "--log-level", "debug")
    wait_for_line(log, "Connect call failed", process)  # an attempt failed: it is trying again
    process.send_signal(signal.SIGTERM)
    assert exit_code(process, log) == 0, log.read_text()
    assert "Traceback" not in log.read_text()


async def publish(url: str, stream: str, count: int) -> None:
    """Create ``stream`` (subjects ``STREAM.>``) and publish ``count`` orders into it."""
    client = await nats.connect(url)
    try:
        await client.jetstream().add_stream(name=stream, subjects=[f"{stream}.>"])
    finally:
        await client.close()
    await publish_more(url, stream, range(count))


async def publish_more(url: str, stream: str, ids: range) -> None:
    client = await nats.connect(url)
    try:
        js = client.jetstream()
        for i in ids:
            await js.publish(f"{stream}.new", json.dumps({"id": i, "payload": f"order {i}"}).encode())
    finally:
        await client.close()


def wait_for_received(receiver: Receiver, count: int, process: subprocess.Popen[bytes], log: Path) -> None:
    """Return once the receiver recorded ``count`` requests; fail if the run exits first or within :data:`GUARD`."""
    eventually_sync(lambda: recorded_count(receiver.record) >= count,
                    what=f"the receiver getting {count} requests", timeout=GUARD, interval=0.05,
                    unless=exited(process, log), details=lambda: log.read_text()[-4000:])


@contextlib.contextmanager
def server_lost_under_a_run(tmp_path: Path, receiver: Receiver, server: NatsServer) -> Iterator[RunUnderTest]:
    """A run delivering 5 orders from a stream of ``server``, which is then SIGKILLed: yields once the
    run logged the loss; then SIGTERMs the run, which must exit 0, without a traceback."""
    stream = f"lost_{uuid.uuid4().hex[:12]}"
    asyncio.run(publish(server.url, stream, 5))
    spec = nats_spec(tmp_path, server.url, stream, f"http://127.0.0.1:{receiver.port}/events", CONNECT_TIMEOUT)
    process, log = start_run(tmp_path, spec)
    try:
        wait_for_received(receiver, 5, process, log)
        server.kill()
        wait_for_line(log, "disconnected; reconnecting", process)
        yield RunUnderTest(stream, process, log)
        process.send_signal(signal.SIGTERM)
        assert exit_code(process, log) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "Traceback" not in log.read_text()


def test_sigterm_while_a_lost_server_is_awaited_ends_the_run_and_the_loss_is_logged_once_without_traceback(
        tmp_path: Path, receiver: Receiver, own_nats_server: NatsServer) -> None:
    with server_lost_under_a_run(tmp_path, receiver, own_nats_server) as run:
        pass  # SIGTERM while it waits for the server
    text = run.log.read_text()
    assert text.count("disconnected; reconnecting") == 1, text


def test_a_server_lost_and_back_is_reconnected_to_and_read_on_each_change_logged_once(
        tmp_path: Path, receiver: Receiver, own_nats_server: NatsServer) -> None:
    with server_lost_under_a_run(tmp_path, receiver, own_nats_server) as run:
        own_nats_server.start()  # on its store: the stream and its 5 messages are back
        wait_for_line(run.log, "reconnected to", run.process)
        asyncio.run(publish_more(own_nats_server.url, run.stream, range(5, 10)))
        wait_for_received(receiver, 10, run.process, run.log)
    text = run.log.read_text()
    assert (text.count("disconnected; reconnecting"), text.count("reconnected to")) == (1, 1), text
