"""Chaos harness: pipelines run under randomly injected faults, then an audit.

Two pipelines run side by side as real ``egress run --until-drained`` processes on their own state
directories:

* ``flights``: the demo's flights pipeline (``examples/http_delivery``, its first ``--rows`` rows)
  delivering to the receiver of ``egress receiver --record`` (``egress.receiver.app``, started
  without the CLI's imports so that a restart is quick) through a fault-injecting HTTP proxy on loopback
  (:class:`FaultProxy`, in this process). With ``--cluster`` it runs as ``--workers`` worker
  processes on a nats-server (``--engine nats://…``) instead of the embedded SQLite engine.
* ``retryable``: the retryable async request example (``examples/retryable_async_request``, the
  simulated variant, retry delay 1 s) on ``--events`` random events: its external ``total_length``
  per key must come out exactly as computed here (internal state exactly once).

Faults come from a :class:`Schedule` drawn from ``random.Random(seed)`` alone (the seed is
printed; ``--seed`` replays a run's schedule: kinds, order, gaps, durations and which of the live
targets each hits, whatever processes are up, though not the processes' own timing), one every
0.2 to 1.2 s. A fault waits until something it can hit has shown progress since its start (a
request at the proxy, a commit in its state), so that none is spent on a process still starting
up. Faults overlap: a stop, a receiver outage or a burst goes on while the next ones land, and
every outage (a 5xx or 429 burst, the receiver down) is followed by a SIGKILL of the flights
process at a random moment from inside it to 1.5 s after it, while its failed attempts wait to be
retried. A proxy fault that no request met (a stall queued as the round drained) is listed and not
counted; the rounds go on until ``--faults`` faults met something:

=================  ===========================================================================
``egress_kill``    SIGKILL of an egress process (flights or retryable), then restart at once
``egress_stop``    SIGSTOP of an egress process for 0.2 to 1.5 s, then SIGCONT
``receiver_kill``  SIGKILL of the receiver, down for 0.2 to 1.5 s, restarted on its record file
``http_5xx``       30 to 100 % of the requests answered 500, 502 or 503 by the proxy for 0.3 to 2 s
``http_429``       30 to 100 % answered 429 (half of them with ``Retry-After: 1``) for 0.3 to 2 s
``slow``           every response held 50 to 500 ms for 1 to 3 s
``stall``          the next 1 to 8 responses held past the sink's attempt timeout (after the
                   receiver recorded them: the sink gives up and sends again)
``reset``          the next 1 to 20 connections reset: half while the request is read (the receiver
                   never sees it), half after the response head and 1 byte of body
``worker_kill``    (``--cluster``) SIGKILL of a flights worker, then restart with its worker id
``nats_restart``   (``--cluster``) SIGKILL of the nats-server, down 0.2 to 1 s, restarted on its store
=================  ===========================================================================

When a pipeline drains before the faults are used up, a new round starts (fresh state directories
and record); the last round ends when its processes exit 0 after the last fault. Each round is then
audited:

* every non-null flight delivered (a 2xx recorded under its idempotency key, the keys computed
  here from the CSV and the message id layout), nothing else, one body per key;
* every duplicate explained by a causal condition on the process the fault hit, from evidence (the
  proxy's record of each attempt: who sent it, when it arrived and was answered, what it met; the
  committed state read after each kill; the cluster's committed outboxes at each change of hands),
  never by time windows alone. The earlier delivery's attempt:

  - ``network``: its 2xx never reached the sink whole (the proxy reset, stalled or lost it);
  - ``timeout``: took at least 80 % of the sink's attempt timeout;
  - ``kill``: the key was in a SIGKILLed run's committed, unacknowledged outbox (its SQLite state,
    or with ``--cluster`` the NATS checkpoint and outbox of the partitions the worker held), the
    attempt sent by that run or before its death, and the key sent again after it;
  - ``stop``: the run that sent it again had an attempt of the key in flight (arrived at the
    proxy, not yet answered) while it was SIGSTOPped;
  - ``handover`` (``--cluster``): the key's ``to_json`` partition changed hands (its lease's generation,
    :class:`ClusterWatch`) while the key was committed and unacknowledged in its outbox, before
    the second delivery; ``nats`` when that change of hands came with a nats-server restart.

  Any other duplicate, and one whose record names no attempt of the proxy, is ``unexplained`` and
  fails the audit;
* the retryable example's totals exact and no request left in retry state;
* ``PRAGMA integrity_check`` ``ok`` on every SQLite file of the killed process's state directory
  after every kill (before the restart), and of every state directory at the end.

The last line is the summary; exit 1 when the audit fails (the work directory is kept then).

    python benchmarks/chaos.py --faults 100            # make chaos
    python benchmarks/chaos.py --faults 10 --rows 8000 --seed 7
    python benchmarks/chaos.py --faults 30 --cluster
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import ctypes
import gzip
import hashlib
import itertools
import logging
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.runtime.test_exactly_once import totals  # noqa: E402
from tests.e2e.runtime.test_exactly_once import write_pipeline as write_retryable  # noqa: E402
from tests.e2e.runtime.test_kill_restart import read_in_flight  # noqa: E402

from egress.cli.state import state_lines  # noqa: E402
from egress.keys import encode_key, partition_of  # noqa: E402

FLIGHTS = ROOT / "examples" / "http_delivery"
FLIGHTS_DATA = FLIGHTS / "data" / "flights-2013-01.csv.gz"
RETRYABLE = ROOT / "examples" / "retryable_async_request"
FLIGHTS_SOURCE, FLIGHTS_COMPUTATION, FLIGHTS_SINK = "flights_csv", "to_json", "http"
RUN_HEADER = "X-Chaos-Run"
ATTEMPT_HEADER = "X-Chaos-Attempt"
ATTEMPT_TIMEOUT = 3.0  # the sink's attempt_timeout here: a stall outlasts it
STALL = ATTEMPT_TIMEOUT + 1.0
TIMEOUT_SHARE = 0.8  # an attempt this share of the attempt timeout long may have been given up on
FAULT_GAP = (0.2, 1.2)
WATCH_PERIOD = 0.1  # seconds between the cluster watch's polls
NAMING_PERIOD = 0.3  # seconds between the proxy's reads of /proc for the senders of new connections
PR_SET_PDEATHSIG = 1  # linux/prctl.h
try:  # looked up here, not in the forked child (which shares the harness's threads' locks)
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (OSError, AttributeError):
    _prctl = None
LEASE_TTL = 2.0  # seconds, --lease-ttl of the cluster workers
DRAIN_TIMEOUT = 240.0
FIRST_REQUEST_TIMEOUT = 90.0
NETWORK_KINDS = ("receiver_kill", "http_5xx", "http_429", "slow", "stall", "reset")
PROCESS_KINDS = ("egress_kill", "egress_stop")
CLUSTER_KINDS = ("worker_kill", "nats_restart")
DYNAMIC_SPEC = {"computations": {FLIGHTS_COMPUTATION: {"sinks": {FLIGHTS_SINK: {"parameters": {
    "request_timeout": "10m", "attempt_timeout": f"{ATTEMPT_TIMEOUT:g}s", "retry_initial_delay": "50ms",
    "retry_minimum_delay": "50ms", "retry_maximum_delay": "1s", "max_attempt_count": 100,
    "retry_after_maximum_delay": "1s"}}}}}}
"""Retries that outlast every fault here: 100 attempts at most 1 s apart, 10 minutes per message."""


# -- the fault-injecting proxy ------------------------------------------------------------------


@dataclass
class Fault:
    """One injected fault: its number in the schedule, kind, target (a run's label, ``receiver``,
    ``proxy`` or ``nats``), wall time, and how many requests or processes it met (``met``; a proxy
    fault that no request met is not counted as injected). ``open`` while it may still meet one."""

    number: int
    kind: str
    target: str
    time: float
    met: int = 0
    open: bool = False
    note: str = ""

    @property
    def pending(self) -> bool:
        return self.open and not self.met


@dataclass
class Attempt:
    """One request the proxy handled: its outcome, its sender (the label of the egress run that sent
    it, ``""`` when not found), wall times of its arrival and of the end of its answer, how long it
    took (seconds) and the fault it met (``None``: none)."""

    outcome: str  # passed | injected | reset_request | reset_response | stalled | upstream_lost
    sender: str = ""
    started: float = 0.0
    answered: float = 0.0
    seconds: float = 0.0
    fault: Fault | None = None


def socket_owners(server_port: int, processes: dict[int, str]) -> dict[int, str]:
    """The label (a value of ``processes``, pid → label) of the process holding each loopback TCP
    connection to ``server_port``, by the connection's client port, read from ``/proc`` in one pass
    (Linux; ``{}`` elsewhere): the connections' socket inodes from ``/proc/net/tcp``, then each
    process's descriptors."""
    by_inode = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == server_port:
                by_inode[f"socket:[{fields[9]}]"] = int(fields[1].rsplit(":", 1)[1], 16)
    owners = {}
    for pid, label in list(processes.items()):
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                port = by_inode.get(os.readlink(f"/proc/{pid}/fd/{descriptor}"))
            except OSError:
                continue
            if port is not None:
                owners[port] = label
    return owners


@dataclass
class Connection:
    """A connection the proxy accepted: its client port, its sender once known, and the attempts
    made on it before that."""

    port: int
    sender: str = ""
    unnamed: list[Attempt] = field(default_factory=list)


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of the receiver, in a thread of its own, that injects the
    network faults the harness asks for. Every forwarded request gets an ``X-Chaos-Attempt`` header
    (recorded by the receiver) whose :class:`Attempt` says who sent it, what the sink got back and
    which fault it met. The sender is the ``X-Chaos-Run`` header, or with ``by_socket`` (cluster
    workers share one Spec, hence one header) the egress process holding the connection's socket
    (``processes``: pid → label, kept by the harness), found by a thread of its own that reads
    ``/proc`` once every :data:`NAMING_PERIOD` while a connection is unnamed (a read of the
    machine's TCP table can take 50 ms: never in the proxy's loop, never once per connection)."""

    def __init__(self, seed: int) -> None:
        self.upstream_port = 0
        self.attempts: dict[int, Attempt] = {}
        self.senders_seen: set[str] = set()  # the runs that have sent something
        self.last_request = 0.0  # monotonic time of the latest request
        self.by_socket = False
        self.processes: dict[int, str] = {}
        self.receiver_down: Fault | None = None  # the receiver_kill whose outage is on
        self._connections: dict[object, Connection] = {}  # by transport
        self._unnamed: list[Connection] = []
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._statuses: tuple[int, ...] = ()
        self._statuses_until = 0.0
        self._statuses_fault: Fault | None = None
        self._share = 1.0
        self._slow_until = 0.0
        self._slow_fault: Fault | None = None
        self._stalls: deque[Fault] = deque()
        self._resets: deque[Fault] = deque()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._serve, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fault proxy did not start within 30 s")
        threading.Thread(target=self._name_connections, name="fault-proxy-senders", daemon=True).start()

    # faults, set from the harness thread
    def answer(self, statuses: tuple[int, ...], seconds: float, share: float, fault: Fault) -> None:
        """For ``seconds``, answer ``share`` of the requests (at random) with one of ``statuses``."""
        with self._lock:
            self._statuses, self._statuses_until = statuses, time.monotonic() + seconds
            self._share, self._statuses_fault = share, fault

    def slow_down(self, seconds: float, fault: Fault) -> None:
        with self._lock:
            self._slow_until, self._slow_fault = time.monotonic() + seconds, fault

    def stall(self, count: int, fault: Fault) -> None:
        with self._lock:
            self._stalls.extend([fault] * count)

    def reset(self, count: int, fault: Fault) -> None:
        with self._lock:
            self._resets.extend([fault] * count)

    def clear(self) -> None:
        with self._lock:
            self._statuses_until = self._slow_until = 0.0
            self._stalls.clear()
            self._resets.clear()
            self.receiver_down = None

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    # the proxy itself
    def _take(self, attempt: Attempt) -> tuple[str, float, int]:
        """The fault for the next request: (kind, delay seconds, status); ``attempt.fault`` the one it met."""
        with self._lock:
            now = time.monotonic()
            delay = 0.0
            if now < self._slow_until:
                delay, attempt.fault = self._random.uniform(0.05, 0.5), self._slow_fault
            if now < self._statuses_until and self._random.random() < self._share:
                attempt.fault = self._statuses_fault
                kind, status = "status", self._random.choice(self._statuses)
            elif self._resets:
                attempt.fault = self._resets.popleft()
                kind, status = self._random.choice(("reset_request", "reset_response")), 0
            elif self._stalls:
                attempt.fault = self._stalls.popleft()
                kind, status = "stall", 0
            else:
                kind, status = "", 0
            if attempt.fault is not None:
                attempt.fault.met += 1
            return kind, delay, status

    def _sender(self, request: web.Request, attempt: Attempt) -> None:
        """Name ``attempt``'s sender now, or once the connection it came on is named."""
        if not self.by_socket:
            attempt.sender = request.headers.get(RUN_HEADER, "")
            self.senders_seen.add(attempt.sender)
            return
        transport = request.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        if transport is None or not peer:
            return
        with self._lock:
            connection = self._connections.get(transport)
            if connection is None:
                if len(self._connections) > 1024:
                    self._connections = {known: found for known, found in self._connections.items()
                                         if not known.is_closing()}
                connection = self._connections[transport] = Connection(peer[1])
                self._unnamed.append(connection)
            attempt.sender = connection.sender
            if not connection.sender:
                connection.unnamed.append(attempt)

    def _name_connections(self) -> None:
        while self._thread.is_alive():
            time.sleep(NAMING_PERIOD)
            with self._lock:
                if not self._unnamed:
                    continue
            owners = socket_owners(self.port, self.processes)
            with self._lock:
                waiting = []
                for connection in self._unnamed:
                    sender = owners.get(connection.port, "")
                    if not sender:
                        if len(connection.unnamed) and time.time() - connection.unnamed[0].started < 5.0:
                            waiting.append(connection)  # after 5 s it is gone: its sender stays unknown
                        continue
                    connection.sender = sender
                    self.senders_seen.add(sender)
                    for attempt in connection.unnamed:
                        attempt.sender = sender
                    connection.unnamed.clear()
                self._unnamed = waiting

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with ClientSession(connector=TCPConnector(limit=256), timeout=ClientTimeout(total=30),
                                 auto_decompress=False) as session:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", lambda request: self._handle(session, request))
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

    async def _handle(self, session: ClientSession, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        number = next(self._numbers)
        attempt = Attempt("passed", "", time.time())
        self._sender(request, attempt)
        self.last_request = started
        kind, delay, status = self._take(attempt)
        self.attempts[number] = attempt
        try:
            return await self._respond(session, request, number, attempt, kind, delay, status)
        finally:
            attempt.seconds = time.monotonic() - started
            attempt.answered = time.time()

    async def _respond(self, session: ClientSession, request: web.Request, number: int, attempt: Attempt,
                       kind: str, delay: float, status: int) -> web.StreamResponse:
        if kind == "reset_request":
            attempt.outcome = "reset_request"
            await request.content.read(1)
            return self._abort(request)
        body = await request.read()
        if kind == "status":
            attempt.outcome = "injected"
            await asyncio.sleep(delay)
            retry_after = {"Retry-After": "1"} if status == 429 and self._random.random() < 0.5 else {}
            response = web.Response(status=status, text="injected by the chaos proxy\n", headers=retry_after)
            await response.prepare(request)
            return response
        headers = {name: value for name, value in request.headers.items()
                   if name.lower() not in ("host", "content-length", "connection", "transfer-encoding")}
        headers[ATTEMPT_HEADER] = str(number)
        try:
            async with session.request(request.method, f"http://127.0.0.1:{self.upstream_port}{request.path_qs}",
                                       data=body, headers=headers) as upstream:
                status, payload = upstream.status, await upstream.read()
        except (ClientError, TimeoutError, OSError):
            attempt.outcome = "upstream_lost"
            down = self.receiver_down
            if down is not None and attempt.fault is None:
                attempt.fault = down
                down.met += 1
            return web.Response(status=502, text="the receiver is down\n")
        await asyncio.sleep(delay)
        if kind == "stall":
            attempt.outcome = "stalled"
            await asyncio.sleep(STALL)
        if kind == "reset_response":
            attempt.outcome = "reset_response"
            response = web.StreamResponse(status=status)
            response.content_length = len(payload) + 64
            await response.prepare(request)
            await response.write(b"o")
            return self._abort(request, response)
        response = web.Response(status=status, body=payload)
        await response.prepare(request)
        await response.write_eof()  # the answer is on its way before ``answered`` is taken
        return response

    @staticmethod
    def _abort(request: web.Request, response: web.StreamResponse | None = None) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.abort()
        return response if response is not None else web.Response(status=499)


# -- processes -----------------------------------------------------------------------------------


def die_with_the_harness() -> None:
    """In a child before it runs (``preexec_fn``): SIGKILL it when the harness dies, even by SIGKILL
    (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing), so that no receiver or egress run outlives it."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def stop_process(process: subprocess.Popen[Any]) -> None:
    """SIGCONT (it may be stopped) and SIGKILL ``process`` if it still runs, and reap it."""
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.kill()
    process.wait()


RECEIVER = """
import asyncio, socket, sys
from pathlib import Path
from egress.receiver.app import ReceiverConfig, serve
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
async def main():
    ready = asyncio.Event()
    server = asyncio.create_task(serve(ReceiverConfig(record=Path(sys.argv[1])), "127.0.0.1", port, ready))
    await asyncio.wait({server, asyncio.create_task(ready.wait())}, return_when=asyncio.FIRST_COMPLETED)
    if server.done():
        await server
    print(f"egress receiver listening on http://127.0.0.1:{port}/", flush=True)
    await server
asyncio.run(main())
"""


@dataclass
class ReceiverProcess:
    """``egress receiver --record RECORD`` (its app, :func:`egress.receiver.app.serve`, without the
    CLI's imports: a restart takes a fraction of the time) on a free port, restartable on the same
    record (appended, line by line: a record survives a SIGKILL)."""

    record: Path
    process: subprocess.Popen[str] | None = None
    port: int = 0

    def start(self) -> int:
        self.process = subprocess.Popen([sys.executable, "-c", RECEIVER, str(self.record)], cwd=ROOT,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        preexec_fn=die_with_the_harness)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
        if not found:
            stop_process(self.process)
            raise RuntimeError(f"the receiver did not start: {line!r}")
        self.port = int(found.group(1))
        return self.port

    def kill(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None


@dataclass
class EgressRun:
    """One pipeline's ``egress run --until-drained`` process (or cluster worker), restartable;
    ``command(run)`` gives the command line of its ``run``-th start. ``kills`` and ``stops`` log
    what was done to it; ``processes`` (shared with the proxy) maps each started pid to its label."""

    name: str
    state: Path
    log: Path
    command: Callable[[int], list[str]]
    processes: dict[int, str]
    process: subprocess.Popen[bytes] | None = None
    runs: int = 0
    done: bool = False
    finished: float = 0.0  # monotonic time of its exit 0
    kills: list[Kill] = field(default_factory=list)
    stops: list[Stop] = field(default_factory=list)
    progressed: Callable[[EgressRun], bool] = lambda run: True
    stopped: bool = False  # SIGSTOPped, its SIGCONT still to come
    started: float = 0.0  # monotonic time of the current run's start
    started_signature: object = None

    def start(self) -> None:
        self.started_signature = state_signature(self.state)
        self.started = time.monotonic()
        self.stopped = False
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(self.command(self.runs), cwd=ROOT, stdout=output,
                                            stderr=subprocess.STDOUT, preexec_fn=die_with_the_harness)
        self.runs += 1
        self.processes[self.process.pid] = self.label

    @property
    def label(self) -> str:
        """The current run's name, ``NAME/RUN``: its ``X-Chaos-Run`` header, or (cluster workers) the
        proxy's name for the sender of its connections."""
        return f"{self.name}/{self.runs - 1}"

    def running(self) -> bool:
        return not self.done and self.process is not None and self.process.poll() is None

    def working(self) -> bool:
        """Running, and this run has shown progress (``progressed``): a fault then lands mid-work,
        not while it starts up."""
        return self.running() and self.progressed(self)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]


def state_signature(state: Path) -> tuple[tuple[int, int], ...]:
    """Sizes and modification times of a state directory's SQLite files: a change is a commit."""
    found = []
    for name in ("egress.sqlite3", "egress.sqlite3-wal"):
        try:
            status = (state / name).stat()
        except FileNotFoundError:
            continue
        found.append((status.st_size, status.st_mtime_ns))
    return tuple(found)


@dataclass
class Kill:
    """A SIGKILL: when (wall time, reaped), of which run (label), and the flights keys it left in
    its committed, unacknowledged outbox (``None``: not read, a retryable run)."""

    time: float
    label: str
    in_flight: set[str] | None


@dataclass
class Stop:
    """A SIGSTOP of run ``label`` from ``stopped`` to ``resumed`` (wall times)."""

    label: str
    stopped: float
    resumed: float


# -- the schedule --------------------------------------------------------------------------------


OUTAGE_KINDS = ("receiver_kill", "http_5xx", "http_429")
FLIGHTS_KILL = "flights_kill"  # the kill that follows an outage: egress_kill, or worker_kill with --cluster
DURATIONS = {"egress_stop": (0.2, 1.5), "receiver_kill": (0.2, 1.5), "http_5xx": (0.3, 2.0),
             "http_429": (0.3, 2.0), "slow": (1.0, 3.0), "nats_restart": (0.2, 1.0)}
COUNTS = {"stall": (1, 8), "reset": (1, 20)}


@dataclass(frozen=True)
class PlannedFault:
    """A fault of the schedule: its kind, the seconds after the previous fault, its duration
    (``DURATIONS``), share of the requests (bursts), count (stalls, resets) and ``pick`` in [0, 1),
    which of the live targets it hits (the ``int(pick * n)``-th of the ``n`` there are, by label)."""

    kind: str
    gap: float
    seconds: float
    share: float
    count: int
    pick: float


class Schedule:
    """The faults of a seed, drawn from ``random.Random(seed)`` alone and the same number of draws
    per fault, so a seed replays the same kinds, gaps, durations and picks whatever the processes
    do (which ones are up, how many rounds). After an outage (``OUTAGE_KINDS``) comes a kill of the
    flights process from inside it to 1.5 s after it."""

    def __init__(self, seed: int, cluster: bool) -> None:
        self._random = random.Random(seed)
        self._kinds = [*PROCESS_KINDS, *NETWORK_KINDS, *(CLUSTER_KINDS if cluster else ())]
        self._outage: float | None = None

    def next(self) -> PlannedFault:
        rng = self._random
        gap, kind = rng.uniform(*FAULT_GAP), rng.choice(self._kinds)
        duration, share, count, pick = rng.random(), rng.random(), rng.random(), rng.random()
        if self._outage is not None:
            outage, self._outage = self._outage, None
            return PlannedFault(FLIGHTS_KILL, 0.2 * outage + duration * (0.8 * outage + 1.5), 0.0, 0.0, 0, pick)
        low, high = DURATIONS.get(kind, (0.0, 0.0))
        seconds = low + duration * (high - low)
        fewest, most = COUNTS.get(kind, (0, 0))
        if kind in OUTAGE_KINDS:
            self._outage = seconds
        return PlannedFault(kind, gap, seconds, 0.3 + 0.7 * share, fewest + int(count * (most - fewest + 1)), pick)


# -- the cluster's committed state ---------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """A change of hands of a ``to_json`` partition (its lease's generation changed, or it lapsed and was
    taken again) between two polls (wall times), and the keys the old holder left committed and
    unacknowledged in its outbox (unacknowledged at the first poll, or committed after it): what
    the next holder sends again."""

    before: float
    after: float
    partition: int
    keys: frozenset[str]


@dataclass(frozen=True)
class Poll:
    """One poll of the cluster's committed state: when it started (wall time), each ``to_json``
    partition's lease (owner, generation), its committed, unacknowledged outbox keys, the highest outbox
    seq committed and its outbox chunks (stream sequence → ``(seq, key)`` of each message)."""

    started: float
    leases: dict[int, tuple[str, int]]
    unacknowledged: dict[int, frozenset[str]]
    last_seq: dict[int, int]
    outbox: dict[int, dict[int, tuple[tuple[int, str], ...]]]

    def committed_since(self, earlier: Poll, partition: int) -> frozenset[str]:
        """The keys of ``partition``'s outbox committed after ``earlier`` saw it."""
        last = earlier.last_seq.get(partition, 0)
        return frozenset(key for chunk in self.outbox.get(partition, {}).values() for seq, key in chunk if seq > last)


class ClusterWatch:
    """Reads the pipeline's leases and the flights partitions' committed outboxes from NATS
    (``NatsEngine``, every :data:`WATCH_PERIOD`, in a thread of its own), records every change of hands with the
    keys then committed and unacknowledged (:class:`Change`), and tells which keys a killed worker
    left so (:meth:`left_by`). Acknowledged is read from the committed checkpoint (the sink's
    ``max_persisted_seq_no`` and the outbox's acknowledged seq) independently of how a starting job
    loads its outbox, which is what this checks."""

    def __init__(self, url: str, pipeline: str) -> None:
        self.changes: list[Change] = []
        self.leases: list[tuple[float, float, dict[int, tuple[str, int]]]] = []  # each poll's (start, end, leases)
        self.last: Poll | None = None
        self._seen: dict[int, Poll] = {}
        self._chunks: dict[int, dict[int, tuple[tuple[int, str], ...]]] = {}  # partition → stream seq → chunk
        self._scanned: dict[int, int] = {}  # partition → the last stream sequence of its outbox read
        self._url, self._pipeline = url, pipeline
        self._stop = threading.Event()
        self._polled = threading.Condition()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._watch()), name="cluster-watch", daemon=True)
        self._thread.start()
        with self._polled:
            if not self._polled.wait_for(lambda: self.last is not None, 30):
                raise RuntimeError("the cluster watch did not read the engine within 30 s")

    async def _watch(self) -> None:
        from egress.engines.nats.engine import NatsEngine

        engine = NatsEngine([self._url], self._pipeline)
        await engine.open()
        try:
            while not self._stop.is_set():
                started = time.time()
                try:
                    poll = await self._poll(engine, started)
                except Exception:  # the server is being restarted: the next poll reads it
                    await asyncio.sleep(0.05)
                    continue
                for partition, lease in poll.leases.items():
                    seen = self._seen.get(partition)  # the last poll that saw the partition held
                    if seen is not None and seen.leases[partition][1] != lease[1]:
                        # what the old holder left: unacknowledged at the last poll that saw its
                        # lease, and committed since (not what the new holder acknowledged since)
                        self.changes.append(Change(seen.started, time.time(), partition, (
                            seen.unacknowledged.get(partition, frozenset()) | poll.committed_since(seen, partition))))
                    self._seen[partition] = poll
                self.leases.append((poll.started, time.time(), poll.leases))
                with self._polled:
                    self.last = poll
                    self._polled.notify_all()
                await asyncio.sleep(WATCH_PERIOD)
        finally:
            await engine.close()

    async def _poll(self, engine: Any, started: float) -> Poll:
        """Read the leases, and each partition's checkpoint and the outbox chunks committed since the
        last poll (chunks never change: each is decoded once, and dropped once acknowledged)."""
        from egress.engines.nats import records
        from egress.engines.nats.records import CheckpointRecord

        js, layout = engine._js(), engine._layout  # the committed data itself, not load_checkpoint's view
        leases = {lease.partition: (lease.owner, lease.generation) for lease in await engine.leases()
                  if lease.consumer == FLIGHTS_COMPUTATION}
        unacknowledged, last_seq, outboxes = {}, {}, {}
        for partition in leases:
            stored = await js.last(layout.checkpoint(FLIGHTS_COMPUTATION, partition))
            record = CheckpointRecord() if stored is None else CheckpointRecord.decode(stored.data)
            progress = record.sinks.get(FLIGHTS_SINK)
            low = max(record.acknowledged, progress.max_persisted_seq_no if progress is not None else 0)
            chunks = self._chunks.setdefault(partition, {})
            subject = layout.outbox_chunks(FLIGHTS_COMPUTATION, partition)
            for chunk in await js.scan(subject, self._scanned.get(partition, 0) + 1):
                self._scanned[partition] = chunk.seq
                chunks[chunk.seq] = tuple((message.seq, message.message_id.hex().upper())
                                          for message in records.outbox_chunk_messages(chunk.data)
                                          if message.row.get("payload") is not None)
            for done in [seq for seq, chunk in chunks.items() if not chunk or chunk[-1][0] <= low]:
                del chunks[done]
            outboxes[partition] = dict(chunks)
            # seq <= last_seq: an orphan chunk (a commit that failed between its outbox chunk and its
            # checkpoint, engines/nats/views.py committed_chunks) is not committed
            unacknowledged[partition] = frozenset(key for chunk in chunks.values() for seq, key in chunk
                                                  if low < seq <= record.last_seq)
            last_seq[partition] = record.last_seq
        return Poll(started, leases, unacknowledged, last_seq, outboxes)

    def left_by(self, worker_id: str, killed: float, *, wait: bool) -> set[str]:
        """The keys committed and unacknowledged in the partitions ``worker_id`` held, SIGKILLed at
        ``killed`` (wall time): those of the last poll before the kill and (with ``wait``: the server
        is up) of the first that started after it, before anyone else can hold them."""
        before = self.last
        assert before is not None
        polls = [before]
        if wait:
            with self._polled:
                if self._polled.wait_for(lambda: self.last is not None and self.last.started > killed, 10):
                    assert self.last is not None
                    polls.append(self.last)
        held = {partition for poll in polls for partition, (owner, _) in poll.leases.items() if owner == worker_id}
        return {key for poll in polls for partition in held for key in poll.unacknowledged.get(partition, ())}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# -- the pipelines and their expectations --------------------------------------------------------


def write_flights(directory: Path, rows: int | None) -> tuple[Path, dict[str, int]]:
    """The flights CSV (its first ``rows`` rows, or all) and the idempotency keys its non-null
    messages must arrive under: ``blake2b(pipeline 0x1F source id 0x1F path)[:8] || partition u32
    || position u64 || output index u16``, hex (the message id layout of docs/architecture.md), each
    with the ``to_json`` partition that sends it (``origin``, the stream's ``group_by``, hashed)."""
    path = directory / "flights.csv"
    spec = yaml.safe_load((FLIGHTS / "spec.yaml").read_text())
    prefix = hashlib.blake2b("\x1f".join((spec["pipeline"], FLIGHTS_SOURCE, str(path))).encode(),
                             digest_size=8).digest()
    keys: dict[str, int] = {}
    with gzip.open(FLIGHTS_DATA, "rt", newline="") as text, path.open("w", newline="") as out:
        reader = csv.DictReader(text)
        writer = csv.DictWriter(out, fieldnames=list(reader.fieldnames or ()))
        writer.writeheader()
        for position, row in enumerate(itertools.islice(reader, rows)):
            writer.writerow(row)
            if row["dep_time"] not in ("", "NA"):  # FlightToJson's null payload: nothing is sent
                message_id = prefix + (0).to_bytes(4, "big") + position.to_bytes(8, "big") + (0).to_bytes(2, "big")
                keys[message_id.hex().upper()] = partition_of(encode_key([row["origin"]]), spec["partition_count"])
    return path, keys


def flights_spec(directory: Path, data: Path, port: int, label: str) -> Path:
    spec = yaml.safe_load((FLIGHTS / "spec.yaml").read_text())
    spec["sources"][FLIGHTS_SOURCE]["parameters"]["path"] = str(data)
    sink = spec["computations"][FLIGHTS_COMPUTATION]["sinks"][FLIGHTS_SINK]["parameters"]
    sink["url"] = f"http://127.0.0.1:{port}/events"
    sink["headers"][RUN_HEADER] = label  # a static header: changes no message id and no body
    path = directory / f"{label.replace('/', '-run')}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def egress_command(spec: Path, state: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "egress", "run", str(spec), "--state-dir", str(state), "--quiet",
            "--until-drained", *extra]


def integrity_problems(state: Path) -> list[str]:
    """``PRAGMA integrity_check`` of every SQLite file under ``state``: the files not ``ok``."""
    problems = []
    for path in sorted(state.rglob("*.sqlite3")):
        try:
            database = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
            try:
                result = [row[0] for row in database.execute("PRAGMA integrity_check")]
            finally:
                database.close()
        except sqlite3.Error as error:
            result = [str(error)]
        if result != ["ok"]:
            problems.append(f"{path}: {'; '.join(result)[:300]}")
    return problems


# -- the harness ---------------------------------------------------------------------------------


@dataclass
class Options:
    seed: int
    faults: int
    rows: int | None
    events: int
    cluster: bool
    workers: int
    directory: Path


@dataclass
class Audit:
    """What the rounds found, summed."""

    faults: Counter[str] = field(default_factory=Counter)  # the faults that met something, by kind
    unmet: Counter[str] = field(default_factory=Counter)  # proxy faults no request met: not counted
    rounds: int = 0
    expected: int = 0
    delivered: int = 0
    lost: int = 0
    unexpected: int = 0
    duplicates: Counter[str] = field(default_factory=Counter)
    integrity_checks: int = 0
    failures: list[str] = field(default_factory=list)

    def summary(self, seed: int, seconds: float) -> str:
        faults = ", ".join(f"{kind} {count}" for kind, count in sorted(self.faults.items()))
        unmet = ", ".join(f"{kind} {count}" for kind, count in sorted(self.unmet.items()))
        duplicates = ", ".join(f"{kind} {count}" for kind, count in sorted(self.duplicates.items()))
        result = "PASS" if not self.failures else f"FAIL ({'; '.join(self.failures)[:600]})"
        return (f"chaos seed {seed}: {sum(self.faults.values())} faults ({faults}"
                f"{f'; met nothing, not counted: {unmet}' if unmet else ''}) in {self.rounds} rounds, "
                f"{seconds:.0f} s; delivered {self.delivered} of {self.expected}, lost {self.lost}, "
                f"unexpected {self.unexpected}, duplicates {sum(self.duplicates.values())} ({duplicates or 'none'}); "
                f"retryable state {'exact' if not any('retryable' in f for f in self.failures) else 'WRONG'}; "
                f"integrity {self.integrity_checks} checks "
                f"{'ok' if not any('integrity' in f for f in self.failures) else 'FAILED'}; audit {result}")


class Round:
    """One round: fresh state directories, receiver record and processes, faults of ``schedule``
    until ``budget`` of them met something or the pipelines drain, then the audit."""

    def __init__(self, options: Options, number: int, schedule: Schedule, proxy: FaultProxy, audit: Audit) -> None:
        self.options, self.schedule, self.proxy, self.audit = options, schedule, proxy, audit
        self.directory = options.directory / f"round{number}"
        self.directory.mkdir(parents=True)
        self.nats: Any = None
        if options.cluster:  # a fresh server each round: the pipeline's streams start empty
            from tests.nats_server import NatsServer
            self.nats = NatsServer(self.directory / "nats").start()
        self.receiver = ReceiverProcess(self.directory / "received.jsonl")
        self.flights_data, self.expected_keys = write_flights(self.directory, options.rows)
        data = random.Random(f"{options.seed}:round{number}")  # not the schedule's: rounds do not shift it
        retryable_spec, self.expected_totals = write_retryable(self.directory, data, options.events)
        self.nats_restarts: list[tuple[float, float]] = []
        self.first_request = 0.0
        self.recoveries: list[tuple[float, Callable[[], None]]] = []  # (monotonic time, the end of a fault)
        self.faults: list[Fault] = []
        self.watch: ClusterWatch | None = None
        proxy.processes = {}
        proxy.by_socket = options.cluster
        self.flights: list[EgressRun] = []
        if options.cluster:
            for number_ in range(1, options.workers + 1):
                self.flights.append(self._flights_run(f"w{number_}", (
                    "--engine", self.nats.url, "--worker-id", f"w{number_}", "--lease-ttl", f"{LEASE_TTL:g}")))
        else:
            self.flights.append(self._flights_run("flights", ()))
        self.retryable = EgressRun(
            "retryable", self.directory / "retryable-state", self.directory / "retryable.log",
            lambda run: egress_command(retryable_spec, self.directory / "retryable-state"), proxy.processes,
            progressed=lambda run: state_signature(run.state) != run.started_signature)

    def _flights_run(self, name: str, extra: tuple[str, ...]) -> EgressRun:
        state = self.directory / f"{name}-state"
        dynamic = self.directory / "dynamic.yaml"
        dynamic.write_text(yaml.safe_dump(DYNAMIC_SPEC))
        # every worker of a cluster runs the same Spec, so one header value: the proxy names the
        # sender by the process that holds the connection instead
        return EgressRun(name, state, self.directory / f"{name}.log", lambda run: egress_command(
            flights_spec(self.directory, self.flights_data, self.proxy.port,
                         "cluster/0" if self.options.cluster else f"{name}/{run}"), state,
            "--dynamic-spec", str(dynamic), *extra), self.proxy.processes,
            progressed=lambda run: run.label in self.proxy.senders_seen)

    @property
    def runs(self) -> list[EgressRun]:
        return [*self.flights, self.retryable]

    def play(self, budget: int) -> int:
        """Start everything, inject faults of the schedule while something runs, until ``budget`` of
        them met something; returns how many did."""
        self.proxy.upstream_port = self.receiver.start()
        handled = len(self.proxy.attempts)
        if self.options.cluster:  # from the start: the first hand-overs (a worker joining) too
            pipeline = yaml.safe_load((FLIGHTS / "spec.yaml").read_text())["pipeline"]
            self.watch = ClusterWatch(self.nats.url, pipeline)
        for run in self.runs:
            run.start()
        self.wait_for_delivery(handled)
        while not self._finished():
            met = sum(1 for fault in self.faults if fault.met)
            if met >= budget:
                break
            if met + sum(1 for fault in self.faults if fault.pending) >= budget:
                self.sleep(0.05)  # the last faults may yet meet a request, or end having met none
                continue
            planned = self.schedule.next()
            self.sleep(planned.gap)
            if not self._inject(planned):
                break
        self.recover(everything=True)
        self.proxy.clear()
        for fault in self.faults:
            fault.open = False
            (self.audit.faults if fault.met else self.audit.unmet)[fault.kind] += 1
        with (self.directory / "faults.txt").open("w") as listing:
            for fault in self.faults:
                listing.write(f"{fault.number} {fault.time:.3f} {fault.kind} {fault.target} met {fault.met}"
                              f"{fault.note}\n")
        return sum(1 for fault in self.faults if fault.met)

    def later(self, seconds: float, recovery: Callable[[], None]) -> None:
        """Run ``recovery`` (the end of a fault) ``seconds`` from now, while other faults go on."""
        self.recoveries.append((time.monotonic() + seconds, recovery))

    def recover(self, *, everything: bool = False) -> None:
        """Run the recoveries that are due (all of them with ``everything``), in time order."""
        self.recoveries.sort(key=lambda item: item[0])
        while self.recoveries and (everything or self.recoveries[0][0] <= time.monotonic()):
            self.recoveries.pop(0)[1]()

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, ending faults when they are due meanwhile."""
        deadline = time.monotonic() + seconds
        while (now := time.monotonic()) < deadline:
            self.recover()
            due = min([deadline, *(when for when, _ in self.recoveries)])
            time.sleep(max(0.0, due - now))
        self.recover()

    def wait_for_delivery(self, handled: int) -> None:
        """Wait until the proxy got a request of this round: the faults land while flights flow."""
        deadline = time.monotonic() + FIRST_REQUEST_TIMEOUT
        while len(self.proxy.attempts) == handled:
            if self._finished() or time.monotonic() > deadline:
                raise HarnessFailure(f"no flights request within {FIRST_REQUEST_TIMEOUT:g} s:\n"
                                     f"{self.flights[0].tail()}")
            time.sleep(0.01)
        self.first_request = time.monotonic()

    def _finished(self) -> bool:
        """Whether every process ended; one that ended by itself with an error fails the audit."""
        for run in self.runs:
            if not run.done and run.process is not None and run.process.poll() is not None:
                code = run.process.returncode
                if code != 0:
                    raise HarnessFailure(f"{run.name} exited {code} by itself:\n{run.tail()}")
                run.done = True
                run.finished = time.monotonic()
        return all(run.done for run in self.runs)

    def _targets(self, kind: str) -> list[Any]:
        """What a fault of ``kind`` can hit now, by label (``[]``: nothing yet)."""
        flights = sorted((run for run in self.flights if run.working()), key=lambda run: run.label)
        if kind == "egress_kill":
            return sorted((run for run in self.runs if run.working()), key=lambda run: run.label)
        if kind == "egress_stop":
            return sorted((run for run in self.runs if run.working() and not run.stopped), key=lambda run: run.label)
        if kind in (FLIGHTS_KILL, "worker_kill"):
            return flights
        if not flights or (kind == "receiver_kill" and self.receiver.process is None) or (
                kind == "nats_restart" and self.nats.process is None):
            return []
        return ["nats" if kind == "nats_restart" else "receiver" if kind == "receiver_kill" else "proxy"]

    def _inject(self, planned: PlannedFault) -> bool:
        """Inject ``planned`` once something it can hit is up (waiting meanwhile); ``False`` when the
        pipelines drained first."""
        deadline = time.monotonic() + FIRST_REQUEST_TIMEOUT
        while not (targets := self._targets(planned.kind)):
            if self._finished():
                return False
            if time.monotonic() > deadline:
                raise HarnessFailure(f"nothing a {planned.kind} can hit within {FIRST_REQUEST_TIMEOUT:g} s")
            self.sleep(0.02)
        target = targets[int(planned.pick * len(targets))]
        kind = planned.kind
        if kind == FLIGHTS_KILL:
            kind = "worker_kill" if self.options.cluster else "egress_kill"
        fault = Fault(len(self.faults) + 1, kind, getattr(target, "label", target), time.time())
        self.faults.append(fault)
        if isinstance(target, EgressRun):  # it is working: the fault meets it
            fault.met = 1
            if kind == "egress_stop":
                self.stop_for_a_while(target, planned.seconds)
            else:
                fault.note = self.kill(target)
            return True
        fault.open = True
        if kind == "receiver_kill":
            self.receiver.kill()
            self.proxy.receiver_down = fault
            self.later(planned.seconds, lambda: self.restart_receiver(fault))
            return True
        if kind in ("http_5xx", "http_429"):
            self.proxy.answer((500, 502, 503) if kind == "http_5xx" else (429,), planned.seconds, planned.share, fault)
        elif kind == "slow":
            self.proxy.slow_down(planned.seconds, fault)
        elif kind == "stall":
            self.proxy.stall(planned.count, fault)
        elif kind == "reset":
            self.proxy.reset(planned.count, fault)
        elif kind == "nats_restart":
            fault.met = 1  # every worker's engine meets it
            self.restart_nats_after(planned.seconds)
        if kind not in ("stall", "reset"):
            self.later(planned.seconds, lambda: setattr(fault, "open", False))
        return True

    def restart_nats_after(self, seconds: float) -> None:
        killed = time.time()
        self.nats.kill()

        def restart_nats() -> None:
            self.nats.start()
            self.nats_restarts.append((killed, time.time()))
        self.later(seconds, restart_nats)

    def stop_for_a_while(self, run: EgressRun, seconds: float) -> None:
        """SIGSTOP ``run``'s process now and SIGCONT it ``seconds`` later (unless it was killed since)."""
        process, label = run.process, run.label
        assert process is not None
        started = time.time()
        process.send_signal(signal.SIGSTOP)
        run.stopped = True

        def resume() -> None:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
            if run.process is process:
                run.stopped = False
            run.stops.append(Stop(label, started, time.time()))
        self.later(seconds, resume)

    def restart_receiver(self, fault: Fault) -> None:
        self.proxy.upstream_port = self.receiver.start()
        self.proxy.receiver_down = None
        fault.open = False

    def kill(self, run: EgressRun) -> str:
        """SIGKILL ``run``, read what it left in flight, check its state files, restart it; a note
        on the keys it left."""
        assert run.process is not None
        label = run.label
        run.process.send_signal(signal.SIGKILL)
        run.process.wait()
        killed = time.time()
        in_flight = None
        if run is not self.retryable:  # the committed, unacknowledged outbox: resent
            if self.watch is not None:
                in_flight = self.watch.left_by(run.name, killed, wait=self.nats.process is not None)
            elif (run.state / "egress.sqlite3").exists():
                in_flight = read_in_flight(run.state).keys
            else:
                in_flight = set()
        run.kills.append(Kill(killed, label, in_flight))
        self.check_integrity(run.state, f"after a kill of {run.name}")
        run.start()
        return "" if in_flight is None else f", {len(in_flight)} keys committed and unacknowledged"

    def check_integrity(self, state: Path, when: str) -> None:
        self.audit.integrity_checks += 1
        for problem in integrity_problems(state):
            self.audit.failures.append(f"integrity {when}: {problem}")

    def drain(self) -> None:
        """Wait for every process to exit 0 (the faults are over)."""
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while not self._finished():
            if time.monotonic() > deadline:
                stuck = [run.name for run in self.runs if not run.done]
                raise HarnessFailure(f"{', '.join(stuck)} did not drain within {DRAIN_TIMEOUT:g} s after the "
                                     f"faults:\n" + "\n".join(run.tail() for run in self.runs if not run.done))
            time.sleep(0.05)

    def stop(self) -> None:
        for run in self.runs:
            if run.process is not None:
                stop_process(run.process)
        self.receiver.kill()
        if self.watch is not None:
            self.watch.stop()
        if self.nats is not None:
            self.nats.stop()

    # -- the audit --

    def check(self) -> None:
        self.audit.rounds += 1
        for run in self.runs:
            self.check_integrity(run.state, f"at the end of round {self.directory.name}")
        self.check_flights()
        self.check_retryable()

    def check_flights(self) -> None:
        audit = self.audit
        records = [orjson.loads(line) for line in self.receiver.record.read_bytes().splitlines() if line]
        delivered = sorted((r for r in records if 200 <= r["status"] <= 299), key=lambda r: r["time"])
        by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
        attempted: dict[str, list[Attempt]] = defaultdict(list)  # every recorded attempt of a key
        bodies: dict[str, set[str]] = defaultdict(set)
        for record in records:
            attempt = self.attempt_of(record)
            if attempt is not None:
                attempted[record["idempotency_key"]].append(attempt)
        for record in delivered:
            by_key[record["idempotency_key"]].append(record)
            bodies[record["idempotency_key"]].add(record["body_sha256"])
        lost = self.expected_keys.keys() - by_key.keys()
        unexpected = by_key.keys() - self.expected_keys.keys()
        audit.expected += len(self.expected_keys)
        audit.delivered += len(self.expected_keys.keys() & by_key.keys())
        audit.lost += len(lost)
        audit.unexpected += len(unexpected)
        if lost:
            audit.failures.append(f"{len(lost)} flights lost in {self.directory.name}, e.g. {sorted(lost)[:3]}")
        if unexpected:
            audit.failures.append(f"{len(unexpected)} unexpected keys, e.g. {sorted(unexpected)[:3]}")
        changed = [key for key, found in bodies.items() if len(found) > 1]
        if changed:
            audit.failures.append(f"{len(changed)} keys sent with several bodies, e.g. {changed[:3]}")
        unexplained = []
        evidence = Evidence([kill for run in self.flights for kill in run.kills],
                            [stop for run in self.flights for stop in run.stops],
                            self.watch.changes if self.watch is not None else [], self.nats_restarts)
        for key, deliveries in by_key.items():
            for before, after in itertools.pairwise(deliveries):
                cause = duplicate_cause(key, self.expected_keys.get(key), self.attempt_of(before),
                                        self.attempt_of(after), attempted[key], evidence)
                audit.duplicates[cause] += 1
                if cause.startswith("unexplained"):
                    unexplained.append((key, cause, before["headers"].get(ATTEMPT_HEADER),
                                        after["headers"].get(ATTEMPT_HEADER)))
        if unexplained:
            audit.failures.append(f"{len(unexplained)} unexplained duplicates (key, why, attempt, later attempt), "
                                  f"e.g. {unexplained[:3]}")
            self.write_evidence()

    def write_evidence(self) -> None:
        """The proxy's attempts, kills, stops and changes of hands into the round's directory
        (``evidence.jsonl``), to look into a failed audit."""
        with (self.directory / "evidence.jsonl").open("wb") as out:
            for number, attempt in self.proxy.attempts.items():
                out.write(orjson.dumps({"attempt": number, "outcome": attempt.outcome, "sender": attempt.sender,
                                        "started": attempt.started, "answered": attempt.answered,
                                        "fault": attempt.fault.number if attempt.fault else None}) + b"\n")
            for run in self.flights:
                for kill in run.kills:
                    out.write(orjson.dumps({"kill": kill.label, "time": kill.time,
                                            "in_flight": sorted(kill.in_flight or ())}) + b"\n")
                for stop in run.stops:
                    out.write(orjson.dumps({"stop": stop.label, "stopped": stop.stopped,
                                            "resumed": stop.resumed}) + b"\n")
            for started, ended, leases in self.watch.leases if self.watch is not None else ():
                out.write(orjson.dumps({"poll": started, "ended": ended, "leases": {
                    str(partition): list(lease) for partition, lease in leases.items()}}) + b"\n")
            for change in self.watch.changes if self.watch is not None else ():
                out.write(orjson.dumps({"change": change.partition, "before": change.before, "after": change.after,
                                        "keys": sorted(change.keys)}) + b"\n")

    def attempt_of(self, record: dict[str, Any]) -> Attempt | None:
        """The proxy's :class:`Attempt` of a receiver record (``None``: it names none the proxy made)."""
        number = record["headers"].get(ATTEMPT_HEADER, "")
        return self.proxy.attempts.get(int(number)) if number.isdigit() else None

    def check_retryable(self) -> None:
        state = self.retryable.state
        found = totals(state)
        if found != dict(self.expected_totals):
            wrong = {key: (found.get(key), value) for key, value in self.expected_totals.items()
                     if found.get(key) != value}
            self.audit.failures.append(f"retryable totals wrong in {self.directory.name} (key: found, expected): "
                                       f"{dict(list(wrong.items())[:3])}")
        left = list(state_lines(state, internal=True, external=False))
        if left:
            self.audit.failures.append(f"retryable: {len(left)} requests left in retry state")


@dataclass
class Evidence:
    """What a round recorded of the faults that hit the flights processes: the kills (with the keys
    each left in flight), the stops, the cluster's changes of hands and the nats-server restarts
    (wall times killed, restarted)."""

    kills: list[Kill]
    stops: list[Stop]
    changes: list[Change]
    nats_restarts: list[tuple[float, float]]


def duplicate_cause(key: str, partition: int | None, first: Attempt | None, again: Attempt | None,
                    attempted: list[Attempt], evidence: Evidence) -> str:
    """Why ``key`` (of the ``to_json`` ``partition``) was delivered again by the attempt ``again``
    after its delivery by ``first`` (``attempted``: every attempt of it the receiver recorded): the
    first fault whose causal condition holds (``docs/reliability.md``), else ``unexplained``."""
    if first is None or again is None:
        return "unexplained (no proxy attempt)"  # not sent through the proxy: nothing can explain it
    if first.outcome != "passed":
        return "network"  # the sink never got this 2xx whole
    if first.seconds >= TIMEOUT_SHARE * ATTEMPT_TIMEOUT:
        return "timeout"
    # in the killed run's committed, unacknowledged outbox, sent by it (its request may reach the
    # proxy after its death) or before its death, and sent again after it
    if any(kill.in_flight is not None and key in kill.in_flight and kill.time <= again.started
           and (first.sender == kill.label or first.started <= kill.time) for kill in evidence.kills):
        return "kill"
    # the run that sent it again had an attempt of this key in flight while it was stopped
    if again.sender and any(
            stop.label == again.sender == attempt.sender and attempt.started <= stop.resumed
            and attempt.answered >= stop.stopped and attempt.started < again.started
            for stop in evidence.stops for attempt in attempted):
        return "stop"
    # its partition changed hands with the key committed and unacknowledged, before it was sent again
    for change in evidence.changes:
        if change.partition == partition and key in change.keys and change.before <= again.started:
            if any(killed <= change.after and change.before <= restarted + LEASE_TTL
                   for killed, restarted in evidence.nats_restarts):
                return "nats"
            return "handover"
    return "unexplained"


class HarnessFailure(Exception):
    """A run failed in a way that ends the round (exited by itself, did not drain)."""


def run_chaos(options: Options) -> Audit:
    """Inject ``options.faults`` faults (that met something) over as many rounds as it takes; the
    audit of them all."""
    schedule = Schedule(options.seed, options.cluster)
    audit = Audit()
    proxy = FaultProxy(random.Random(f"{options.seed}:proxy").randrange(2**32))
    try:
        injected, number = 0, 0
        while injected < options.faults or number == 0:
            round_ = Round(options, number, schedule, proxy, audit)
            try:
                started = time.monotonic()
                injected += round_.play(options.faults - injected)
                faulted = time.monotonic()
                round_.drain()
                ends = ", ".join(f"{run.name} {run.finished - started:.1f} s" for run in round_.runs)
                outcomes = Counter(attempt.outcome for attempt in proxy.attempts.values())
                senders = Counter(attempt.sender or "unknown" for attempt in proxy.attempts.values())
                print(f"round {number}: first request after {round_.first_request - started:.1f} s, "
                      f"faults until {faulted - started:.1f} s; drained: {ends}; proxy (all rounds): "
                      f"{dict(outcomes)}, by sender {dict(sorted(senders.items()))}", flush=True)
                round_.check()
            except HarnessFailure as failure:
                audit.failures.append(str(failure))
                print(str(failure), file=sys.stderr)
                break
            finally:
                round_.stop()
            for fault in round_.faults:
                print(f"  fault {fault.number} {fault.kind} of {fault.target}: "
                      f"{f'met {fault.met}{fault.note}' if fault.met else 'met nothing (not counted)'}")
            print(f"round {number}: {injected} faults so far, {audit.delivered} flights delivered, "
                  f"{sum(audit.duplicates.values())} duplicates, failures: {len(audit.failures)}", flush=True)
            number += 1
    finally:
        proxy.close()
    return audit


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=None, help="the fault schedule's seed (default: random)")
    parser.add_argument("--faults", type=int, default=100, help="faults to inject in all (default 100)")
    parser.add_argument("--rows", type=int, default=None, help="flights rows per round (default: all 27,004)")
    parser.add_argument("--events", type=int, default=20_000, help="retryable events per round (default 20,000)")
    parser.add_argument("--cluster", action="store_true", help="flights on NATS workers; worker and nats faults")
    parser.add_argument("--workers", type=int, default=2, help="flights workers with --cluster (default 2)")
    parser.add_argument("--directory", type=Path, default=None, help="work directory (default: a temporary one)")
    return parser.parse_args(argv)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    seed = arguments.seed if arguments.seed is not None else random.SystemRandom().randrange(2**31)
    directory = arguments.directory or Path(tempfile.mkdtemp(prefix="egress-chaos-"))
    directory.mkdir(parents=True, exist_ok=True)
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGTERM, _exit_on_signal)  # as Ctrl-C: every process started is stopped on the way out
    print(f"chaos: seed {seed}, {arguments.faults} faults, work directory {directory}", flush=True)
    options = Options(seed, arguments.faults, arguments.rows, arguments.events, arguments.cluster,
                      arguments.workers, directory)
    started = time.monotonic()
    audit = run_chaos(options)
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(audit.summary(seed, time.monotonic() - started), flush=True)
    if audit.failures:
        print(f"work directory kept: {directory}; replay with --seed {seed}", file=sys.stderr)
        return 1
    if arguments.directory is None:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
