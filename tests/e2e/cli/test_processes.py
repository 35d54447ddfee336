"""``egress run`` as a cluster, as a user starts it: two workers on NATS drain the demo, a worker
with another Spec is refused, an unreachable NATS server is one line, ``--processes 2`` drains the
demo on one SQLite state directory."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from examples.cluster.demo import SOURCE_ID, key_partitions, write_data

from tests.e2e.conftest import (
    DYNAMIC_SPEC,
    REPO,
    Receiver,
    hold_after,
    release,
    terminate,
    wait_for_first_request,
    wait_until_held,
    write_spec,
)
from tests.receiver_record import recorded
from tests.waiting import eventually_sync, exited

pytestmark = pytest.mark.e2e
ROWS = 6000  # the demo's first flights: the runs take seconds
ANSWERED_BEFORE_KILL = 1000  # requests the receiver answers before it holds the rest: the kill lands mid-run
CLUSTER = ["--lease-ttl", "2", "--heartbeat-period", "0.5"]


def demo_spec(directory: Path, port: int, run: int) -> Path:
    """The demo's Spec (``write_spec``) on its first :data:`ROWS` flights."""
    path = write_spec(directory, port, run)
    spec = yaml.safe_load(path.read_text())
    data = directory / "flights.csv.gz"
    if not data.exists():  # written once: a worker started on an earlier run's Spec may be reading it
        assert write_data(directory, ROWS) == data
    spec["sources"][SOURCE_ID]["parameters"]["path"] = str(data)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def expected(spec: Path) -> int:
    """How many flights the demo on ``spec`` delivers (the non-cancelled ones)."""
    document = yaml.safe_load(spec.read_text())
    return len(key_partitions(document, Path(document["sources"][SOURCE_ID]["parameters"]["path"])))


def cluster_spec(directory: Path, receiver: Receiver, run: int) -> Path:
    """The demo's Spec under a pipeline name of this test's own (its NATS bucket is new)."""
    path = demo_spec(directory, receiver.port, run)
    spec = yaml.safe_load(path.read_text())
    spec["pipeline"] = f"cluster_{directory.name.replace('-', '_')}"[:60]
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def egress_run(spec: Path, *options: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:
        return subprocess.Popen([sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(DYNAMIC_SPEC),
                                 *options], cwd=REPO, stdout=output, stderr=subprocess.STDOUT)


def distinct_keys(record: Path) -> tuple[int, int]:
    """``(requests, distinct idempotency keys)`` the receiver recorded."""
    keys = [entry["idempotency_key"] for entry in recorded(record)]
    return len(keys), len(set(keys))


@pytest.mark.timeout(240)
def test_two_workers_on_nats_drain_the_demo_and_both_end(
        tmp_path: Path, receiver: Receiver, nats_server: str, egress_processes: list[subprocess.Popen[bytes]]) -> None:
    spec = cluster_spec(tmp_path, receiver, 1)
    for worker in ("worker-1", "worker-2"):
        egress_processes.append(egress_run(spec, "--engine", nats_server, "--worker-id", worker, "--until-drained",
                                           "--quiet", "--state-dir", str(tmp_path / worker), *CLUSTER,
                                           log=tmp_path / f"{worker}.log"))
    for process, worker in zip(egress_processes, ("worker-1", "worker-2"), strict=True):
        assert process.wait(timeout=200) == 0, (tmp_path / f"{worker}.log").read_text()
    requests, distinct = distinct_keys(receiver.record)
    print(f"\ntwo NATS workers: {distinct:,} of {expected(spec):,} delivered, {requests - distinct} sent twice "
          "(in flight at a hand-over)")
    assert distinct == expected(spec)


@pytest.mark.timeout(120)
def test_a_worker_with_another_spec_is_refused_naming_the_spec_file(
        tmp_path: Path, receiver: Receiver, nats_server: str, egress_processes: list[subprocess.Popen[bytes]]) -> None:
    spec = cluster_spec(tmp_path, receiver, 1)
    first = egress_run(spec, "--engine", nats_server, "--quiet", "--state-dir", str(tmp_path / "first"),
                       log=tmp_path / "first.log")  # the default TTL: its membership outlives a busy moment
    egress_processes.append(first)
    wait_for_first_request(receiver.record, 1, first, tmp_path / "first.log")
    other = cluster_spec(tmp_path, receiver, 2)  # another header value: another Spec
    refused = subprocess.run([sys.executable, "-m", "egress", "run", str(other), "--engine", nats_server, "--quiet",
                              "--state-dir", str(tmp_path / "second")], cwd=REPO, capture_output=True, text=True,
                             timeout=60, check=False)
    assert refused.returncode == 2, refused.stderr
    assert f"{other}: worker " in refused.stderr
    assert "runs another Spec" in refused.stderr
    assert "Traceback" not in refused.stderr
    terminate(first)
    assert first.returncode == 0


@pytest.mark.timeout(60)
def test_an_unreachable_nats_server_is_one_line_naming_the_url(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"nats://127.0.0.1:{probe.getsockname()[1]}"  # nobody listens once the probe is closed
    spec = REPO / "examples" / "http_delivery" / "spec.yaml"
    run = subprocess.run([sys.executable, "-m", "egress", "run", str(spec), "--engine", url, "--until-drained",
                          "--state-dir", str(tmp_path / "state")], cwd=REPO, capture_output=True, text=True,
                         timeout=50, check=False)
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"{url}: cannot connect")


@pytest.mark.timeout(240)
def test_two_processes_on_one_state_directory_drain_the_demo(tmp_path: Path, receiver: Receiver) -> None:
    spec = demo_spec(tmp_path, receiver.port, 1)
    run = subprocess.run([sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(DYNAMIC_SPEC),
                          "--processes", "2", "--until-drained", "--state-dir", str(tmp_path / "state"),
                          "--report", str(tmp_path / "report.json")], cwd=REPO, capture_output=True, text=True,
                         timeout=200, check=False)
    assert run.returncode == 0, run.stderr
    assert "egress run --processes 2" in run.stderr
    requests, distinct = distinct_keys(receiver.record)
    report = json.loads((tmp_path / "report.json").read_text())
    print(f"\n--processes 2: {distinct:,} of {expected(spec):,} delivered, {requests - distinct} sent twice, "
          f"{report['messages_per_second']:,.0f} msg/s")
    assert distinct == expected(spec)
    assert report["workers"] == 2
    assert report["drained"] is True
    assert report["rows_read"] == ROWS


def children_of(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.timeout(240)
def test_processes_restarts_a_killed_worker_and_still_delivers_everything(
        tmp_path: Path, receiver: Receiver, egress_processes: list[subprocess.Popen[bytes]]) -> None:
    spec = demo_spec(tmp_path, receiver.port, 1)
    log = tmp_path / "run.log"
    hold_after(receiver, ANSWERED_BEFORE_KILL)
    parent = egress_run(spec, "--processes", "2", "--until-drained", "--state-dir", str(tmp_path / "state"), *CLUSTER,
                        log=log)
    egress_processes.append(parent)
    wait_until_held(receiver, parent, log)
    victim = children_of(parent.pid)[0]
    os.kill(victim, signal.SIGKILL)
    release(receiver)
    assert parent.wait(timeout=200) == 0, log.read_text()
    assert "ended unexpectedly (killed by SIGKILL): starting it again" in log.read_text()
    requests, distinct = distinct_keys(receiver.record)
    print(f"\n--processes 2, one worker SIGKILLed: {distinct:,} of {expected(spec):,}, "
          f"{requests - distinct} sent twice")
    assert distinct == expected(spec)


def wait_for_members(state: Path, pipeline: str, count: int, parent: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until ``count`` workers of ``--processes`` have joined (a child still starting has no
    signal handler yet: a Ctrl-C then would end it as an interrupted start-up, not a clean stop)."""
    from egress.engines import SqliteEngine

    async def members() -> int:
        engine = SqliteEngine(state, pipeline, shared=True)
        await engine.open()
        try:
            return len(await engine.members())
        finally:
            await engine.close()

    eventually_sync(lambda: asyncio.run(members()) >= count, what=f"{count} workers joined", timeout=120,
                    interval=0.2, unless=exited(parent, log), details=log.read_text)


@pytest.mark.timeout(240)
def test_ctrl_c_stops_every_worker_of_processes_and_a_second_run_finishes(
        tmp_path: Path, receiver: Receiver, egress_processes: list[subprocess.Popen[bytes]]) -> None:
    spec = demo_spec(tmp_path, receiver.port, 1)
    log = tmp_path / "run.log"
    state = str(tmp_path / "state")
    parent = egress_run(spec, "--processes", "2", "--state-dir", state, *CLUSTER, log=log)
    egress_processes.append(parent)
    wait_for_first_request(receiver.record, 1, parent, log)
    wait_for_members(Path(state), yaml.safe_load(spec.read_text())["pipeline"], 2, parent, log)
    children = children_of(parent.pid)
    parent.send_signal(signal.SIGINT)
    assert parent.wait(timeout=60) == 0, log.read_text()
    assert not any(Path(f"/proc/{child}").exists() for child in children)
    said = log.read_text().splitlines()
    stopping = "stopping the 2 processes after the message each has in hand; what was processed is committed"
    # Once for both workers, which say nothing of it themselves.
    assert said.count(f"{stopping} (Ctrl-C again to exit at once)") == 1, said
    assert not any(line.startswith("stopping after") for line in said), said
    again = subprocess.run([sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(DYNAMIC_SPEC),
                            "--until-drained", "--quiet", "--state-dir", state], cwd=REPO, timeout=200, check=False)
    assert again.returncode == 0
    assert distinct_keys(receiver.record)[1] == expected(spec)


@pytest.mark.timeout(120)
def test_processes_share_one_throttler_so_its_limit_holds_for_the_whole_run(tmp_path: Path, receiver: Receiver) -> None:
    """With ``--processes 2`` on SQLite the parent serves the DynamicSpec's throttlers once: 600
    requests at 100/s (burst 100) take at least 5 s at the receiver; two controllers, one per
    process, would let them through in about half that."""
    from tests.conftest import payload_spec

    count, limit = 600, 100
    spec, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{receiver.port}/events",
                                 [f"p{i}" for i in range(count)], partition_count=4,
                                 sink_parameters={"throttler_id": "api"})
    document = yaml.safe_load(dynamic.read_text())
    document["throttlers"] = {"api": {"limit": limit, "period": "1s"}}
    dynamic.write_text(yaml.safe_dump(document))
    run = subprocess.run([sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic),
                          "--processes", "2", "--until-drained", "--state-dir", str(tmp_path / "state"),
                          "--report", str(tmp_path / "report.json")], cwd=REPO, capture_output=True, text=True,
                         timeout=100, check=False)
    assert run.returncode == 0, run.stderr
    times = sorted(entry["time"] for entry in recorded(receiver.record))
    _, distinct = distinct_keys(receiver.record)
    print(f"\n--processes 2 with a throttler of {limit}/s: {distinct} delivered in {times[-1] - times[0]:.2f} s")
    assert distinct == count
    assert json.loads((tmp_path / "report.json").read_text())["workers"] == 2
    assert times[-1] - times[0] >= (count - 2 * limit) / limit * 0.95


@pytest.mark.timeout(180)
def test_a_processes_run_killed_outright_leaves_no_worker_nor_throttler_service_running(
        tmp_path: Path, receiver: Receiver, egress_processes: list[subprocess.Popen[bytes]]) -> None:
    """``kill -9`` of the parent: its children (two workers and the throttler service it started)
    end with it instead of running on under init beside the next run's (whose rate limit the two
    services together would exceed)."""
    from tests.conftest import payload_spec

    spec, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{receiver.port}/events",
                                 [f"p{i}" for i in range(3000)], partition_count=4,
                                 sink_parameters={"throttler_id": "api"})
    document = yaml.safe_load(dynamic.read_text())
    document["throttlers"] = {"api": {"limit": 50, "period": "1s"}}
    dynamic.write_text(yaml.safe_dump(document))
    state = tmp_path / "state"
    log = tmp_path / "run.log"
    with log.open("wb") as output:
        parent = subprocess.Popen([sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic),
                                   "--processes", "2", "--until-drained", "--state-dir", str(state), *CLUSTER],
                                  cwd=REPO, stdout=output, stderr=subprocess.STDOUT)
    egress_processes.append(parent)
    eventually_sync(lambda: bool(recorded(receiver.record)), what="a first request delivered", timeout=60,
                    unless=exited(parent, log))
    wait_for_members(state, yaml.safe_load(spec.read_text())["pipeline"], 2, parent, log)
    children = children_of(parent.pid)
    assert len(children) == 3, children  # the two workers and the throttler service
    parent.kill()
    parent.wait()

    def running() -> list[int]:
        return [child for child in children if Path(f"/proc/{child}").exists()
                and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z"]

    try:
        eventually_sync(lambda: not running(), what="the children of the killed parent ended", timeout=60,
                        interval=0.1)
    finally:
        for child in running():
            os.kill(child, signal.SIGKILL)
