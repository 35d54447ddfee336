"""What ``egress run --engine nats://…`` says about committed data, as a user meets it: the NATS bucket
(never ``--state-dir``, which means nothing for it), and ``egress state delete`` as the way to start
over, refused while a worker of the pipeline is a live member. Real nats-server, real processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import nats
import pytest
import yaml

from egress.engines import MemberInfo, NatsEngine
from tests.conftest import payload_spec
from tests.e2e.conftest import REPO, Receiver

pytestmark = pytest.mark.e2e


def egress(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "egress", *arguments], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def cluster_spec(tmp_path: Path, receiver: Receiver, pipeline: str, partition_count: int) -> Path:
    """tests/conftest.py's payload pipeline, named ``pipeline`` (a bucket of this test's own)."""
    written, _ = payload_spec(tmp_path, f"http://127.0.0.1:{receiver.port}/events", ["a", "b", "c"],
                              partition_count=partition_count)
    document = yaml.safe_load(written.read_text())
    document["pipeline"] = pipeline
    spec = tmp_path / f"spec-{partition_count}.yaml"
    spec.write_text(yaml.safe_dump(document))
    return spec


def test_a_cluster_names_its_bucket_and_starts_over_once_the_bucket_is_deleted(
        tmp_path: Path, nats_server: str, receiver: Receiver) -> None:
    pipeline = f"start_over_{tmp_path.name[-20:].replace('-', '_')}"
    bucket = f"NATS bucket egress_{pipeline} at {nats_server}"
    delete = f"`egress state delete {pipeline} --engine {nats_server}`"
    spec = cluster_spec(tmp_path, receiver, pipeline, 1)
    cluster = ["--engine", nats_server, "--until-drained", "--state-dir", str(tmp_path / "NEW")]
    first = egress("run", str(spec), *cluster, cwd=REPO)
    assert first.returncode == 0, first.stderr
    again = egress("run", str(spec), *cluster, cwd=REPO)
    assert again.returncode == 0, again.stderr
    said = " ".join(again.stderr.split())
    assert f"nothing new: {bucket} already holds everything the sources had; to start over, give this Spec " \
           "another pipeline name (a bucket of its own), or, once every worker stopped, delete bucket " \
           f"egress_{pipeline} and everything committed in it: {delete}" in said
    assert "--state-dir" not in said
    assert not (tmp_path / "NEW").exists()

    repartitioned = cluster_spec(tmp_path, receiver, pipeline, 2)
    refused = egress("run", str(repartitioned), *cluster, cwd=REPO)
    assert refused.returncode == 2
    said = " ".join(refused.stderr.split())
    assert said.startswith(f"{repartitioned}: {bucket} was written with partition_count 1; the Spec now says 2: ")
    assert delete in said
    assert "--state-dir" not in said

    deleted = egress("state", "delete", pipeline, "--engine", nats_server, "--yes", cwd=REPO)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stderr == f"deleted {bucket}: the next run of pipeline {pipeline!r} starts over\n"
    fresh = egress("run", str(repartitioned), *cluster, cwd=REPO)
    assert fresh.returncode == 0, fresh.stderr
    assert "nothing new" not in fresh.stderr


def test_state_delete_refuses_while_a_worker_is_a_live_member_and_without_confirmation(
        tmp_path: Path, nats_server: str) -> None:
    pipeline = f"live_{tmp_path.name[-20:].replace('-', '_')}"
    engine = NatsEngine(nats_server, pipeline)

    async def join() -> None:
        await engine.open()
        await engine.register(MemberInfo("w1", "digest"), ttl=120.0)
        await engine.close()

    asyncio.run(join())
    command = ["state", "delete", pipeline, "--engine", nats_server]
    live = egress(*command, "--yes", cwd=REPO)
    assert live.returncode == 1
    assert " ".join(live.stderr.split()) == (
        f"NATS bucket egress_{pipeline} at {nats_server}: worker(s) w1 of pipeline {pipeline!r} are running on it: "
        "stop every worker first (a killed worker stays listed until its --lease-ttl lapses)")

    async def leave() -> None:
        await engine.open()
        await engine.deregister("w1")
        await engine.close()

    asyncio.run(leave())
    unconfirmed = subprocess.run([sys.executable, "-m", "egress", *command], cwd=REPO, capture_output=True, text=True,
                                 timeout=120, stdin=subprocess.DEVNULL)
    assert (unconfirmed.returncode, unconfirmed.stderr) == (2, "not deleted: confirm with --yes\n")
    assert egress(*command, "--yes", cwd=REPO).returncode == 0


def test_state_delete_of_a_pipeline_with_no_bucket_says_so_and_creates_none(tmp_path: Path, nats_server: str) -> None:
    pipeline = f"never_run_{tmp_path.name[-20:].replace('-', '_')}"
    missing = egress("state", "delete", pipeline, "--engine", nats_server, "--yes", cwd=REPO)
    assert missing.returncode == 1
    assert " ".join(missing.stderr.split()) == (
        f"NATS bucket egress_{pipeline} at {nats_server}: no egress state here (no bucket egress_{pipeline} for "
        f"pipeline {pipeline!r}): check the pipeline name and the servers")

    async def streams() -> list[str]:
        connection = await nats.connect(nats_server)
        try:
            return [info.config.name for info in await connection.jetstream().streams_info()]
        finally:
            await connection.close()

    assert f"KV_egress_{pipeline}" not in asyncio.run(streams())
