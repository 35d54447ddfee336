"""One process per ``--worker-id``, end to end: real ``egress run --engine nats://…`` processes, a
real nats-server, a real SIGKILL.

* A second process started under the worker id of a running one is refused (exit 1, one line
  naming the id, the other's pid and host, and the fix) while the first keeps its leases (their
  generations do not move) and then delivers every message exactly once; also when the second runs
  in a pid namespace of its own (a container with the same host name), where the first's pid names
  no process.
* A worker SIGKILLed mid-run and started again under its id takes its record over (no refusal)
  and delivers everything.
* A running worker whose membership record is written by another instance that started before it
  (two that slipped past the start check) stops at its next heartbeat: exit 1, the same line, and
  the record left to the other.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from egress.engines import LeaseInfo, MemberInfo, NatsEngine
from tests.conftest import payload_spec
from tests.e2e.conftest import REPO, Receiver, hold_after, release, wait_until_held
from tests.receiver_record import recorded
from tests.waiting import eventually_sync, exited

pytestmark = pytest.mark.e2e

MESSAGES = 600
ANSWERED = 100  # the receiver answers these, then holds every request: the first worker is mid-run
LEASE_TTL = "4"  # seconds: a heartbeat every second


def spec_of(tmp_path: Path, receiver: Receiver) -> tuple[Path, str]:
    """tests/conftest.py's payload pipeline on 2 partitions, named after the test (its own bucket)."""
    written, _ = payload_spec(tmp_path, f"http://127.0.0.1:{receiver.port}/events",
                              [f"p{i}" for i in range(MESSAGES)], partition_count=2)
    pipeline = f"worker_id_{tmp_path.name[-20:].replace('-', '_')}"
    document = yaml.safe_load(written.read_text())
    document["pipeline"] = pipeline
    written.write_text(yaml.safe_dump(document))
    return written, pipeline


OWN_PID_NAMESPACE = ("unshare", "--pid", "--fork")
"""A command prefix running a process in a pid namespace of its own (root only)."""


def own_pid_namespace_available() -> bool:
    try:
        return subprocess.run([*OWN_PID_NAMESPACE, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def start(processes: list[subprocess.Popen[bytes]], spec: Path, nats_server: str, tmp_path: Path,
          name: str, prefix: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / f"{name}.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "egress", "run", str(spec), "--engine", nats_server, "--worker-id", "w1",
             "--lease-ttl", LEASE_TTL, "--state-dir", str(tmp_path / name), "--until-drained", "--quiet"],
            cwd=REPO, stdout=output, stderr=subprocess.STDOUT)
    processes.append(process)
    return process, log


def held_worker(processes: list[subprocess.Popen[bytes]], tmp_path: Path, receiver: Receiver, nats_server: str,
                name: str) -> tuple[Path, str, subprocess.Popen[bytes], Path]:
    """The test's Spec and pipeline, and a worker ``name`` under ``w1`` started on it and delivering,
    the receiver holding its requests after :data:`ANSWERED`."""
    spec, pipeline = spec_of(tmp_path, receiver)
    hold_after(receiver, ANSWERED)
    process, log = start(processes, spec, nats_server, tmp_path, name)
    wait_until_held(receiver, process, log)
    return spec, pipeline, process, log


def leases(nats_server: str, pipeline: str) -> list[LeaseInfo]:
    async def read() -> list[LeaseInfo]:
        engine = NatsEngine(nats_server, pipeline)
        await engine.open()
        try:
            return await engine.leases()
        finally:
            await engine.close()

    return asyncio.run(read())


def generations(found: list[LeaseInfo]) -> dict[tuple[str, int], int]:
    return {(lease.consumer, lease.partition): lease.generation for lease in found}


def delivered(receiver: Receiver) -> Counter[str]:
    return Counter(str(r["idempotency_key"]) for r in recorded(receiver.record) if r["status"] == 200)


@pytest.mark.parametrize("where", ["same pid namespace", "own pid namespace"])
def test_a_second_process_under_a_running_workers_id_is_refused_and_the_first_goes_on(
        tmp_path: Path, nats_server: str, receiver: Receiver,
        egress_processes: list[subprocess.Popen[bytes]], where: str) -> None:
    prefix = OWN_PID_NAMESPACE if where == "own pid namespace" else ()
    if prefix and not own_pid_namespace_available():
        pytest.skip("unshare --pid needs root here")
    spec, pipeline, first, first_log = held_worker(egress_processes, tmp_path, receiver, nats_server, "first")
    taken = eventually_sync(lambda: generations(leases(nats_server, pipeline)), what="the first worker's leases",
                            unless=exited(first, first_log))

    second, second_log = start(egress_processes, spec, nats_server, tmp_path, "second", prefix)
    assert second.wait(timeout=60) == 1, second_log.read_text()
    assert second_log.read_text() == (
        f"worker id 'w1' is in use: pid {first.pid} on {socket.gethostname()} is running under it; give each "
        "running worker its own --worker-id, or stop the other one\n")
    assert first.poll() is None, first_log.read_text()
    assert generations(leases(nats_server, pipeline)) == taken  # never taken back and forth

    release(receiver)
    assert first.wait(timeout=120) == 0, first_log.read_text()
    counts = delivered(receiver)
    assert len(counts) == MESSAGES
    assert set(counts.values()) == {1}, "no message may be sent twice: the leases never changed hands"


def test_a_worker_killed_and_started_again_under_its_id_takes_its_record_over_and_delivers_everything(
        tmp_path: Path, nats_server: str, receiver: Receiver,
        egress_processes: list[subprocess.Popen[bytes]]) -> None:
    spec, _, killed, _ = held_worker(egress_processes, tmp_path, receiver, nats_server, "killed")
    killed.send_signal(signal.SIGKILL)
    killed.wait()  # its membership record and leases stay live for up to the lease TTL

    release(receiver)
    again, again_log = start(egress_processes, spec, nats_server, tmp_path, "again")
    assert again.wait(timeout=120) == 0, again_log.read_text()
    assert "in use" not in again_log.read_text()
    assert len(delivered(receiver)) == MESSAGES


def test_a_running_worker_whose_record_an_earlier_process_writes_stops_and_leaves_the_record(
        tmp_path: Path, nats_server: str, receiver: Receiver,
        egress_processes: list[subprocess.Popen[bytes]]) -> None:
    _, pipeline, running, running_log = held_worker(egress_processes, tmp_path, receiver, nats_server, "running")
    engine = NatsEngine(nats_server, pipeline)
    earlier = MemberInfo("w1", "any", {"host": "host-z", "pid": 7, "started_at": 0.0, "instance": "earlier",
                                       "renewed_at": 1.0, "heartbeat_period": 1.0})

    async def write() -> list[MemberInfo]:
        await engine.open()
        try:
            await engine.register(earlier, 60.0)  # as the other process's heartbeat does
            return await engine.members()
        finally:
            await engine.close()

    assert asyncio.run(write()) == [earlier]
    assert running.wait(timeout=60) == 1, running_log.read_text()
    assert running_log.read_text().endswith(
        "worker id 'w1' is in use: pid 7 on host-z is running under it; give each running worker its own "
        "--worker-id, or stop the other one\n")
    assert "Traceback" not in running_log.read_text()

    async def listed() -> list[MemberInfo]:
        await engine.open()
        try:
            return await engine.members()
        finally:
            await engine.close()

    assert asyncio.run(listed()) == [earlier]  # not deregistered: the record is the other process's
    release(receiver)
