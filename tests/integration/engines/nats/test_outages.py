"""NatsEngine through server failures: a commit whose answer is lost is applied once; commits wait
out a nats-server killed and restarted on its store; an outage longer than ``outage_timeout``
raises the retryable ``NatsUnavailableError`` and the consumer partition reloads before it commits
again; on a 3-node cluster with R3 streams the loss of the stream leader's node loses nothing.

Each test checks the engine's contents against ``commit_loop.expected_after``: the log's offsets
dense, every commit applied exactly once, nothing of a later commit."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import nats
import pytest

from egress.engines import EpochCommit
from egress.engines.nats import NatsEngine, NatsEngineError, NatsUnavailableError
from tests.conftest import REPO
from tests.engines.commit_loop import CONSUMER, expected_after, numbered_commit, observed
from tests.engines.engines import PIPELINE
from tests.integration.nats_commit_loop import engine_on
from tests.nats_server import NatsCluster, NatsServer
from tests.waiting import eventually

pytestmark = pytest.mark.integration

BUCKET = "egress_outage"
PROGRESS_TIMEOUT = 60.0  # seconds a commit loop may take to report its next commit, outage included


@dataclass
class CommitLoop:
    """The ``nats_commit_loop`` child: ``reported[n]`` is when (monotonic) it reported commit ``n``."""

    process: subprocess.Popen[bytes]
    reported: dict[int, float] = field(default_factory=dict)

    @property
    def last(self) -> int:
        return max(self.reported, default=0)

    def wait_for(self, n: int) -> float:
        """Read its reports until commit ``n`` is reported; returns when it was."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + PROGRESS_TIMEOUT
        while self.last < n:
            if time.monotonic() > deadline:
                pytest.fail(f"the commit loop did not report commit {n} within {PROGRESS_TIMEOUT:g} s "
                            f"(last {self.last})")
            line = self.process.stdout.readline()
            if not line.endswith(b"\n"):
                assert self.process.stderr is not None
                pytest.fail(f"the commit loop ended ({self.process.wait()}): {self.process.stderr.read().decode()}")
            self.reported[int(line)] = time.monotonic()
        return self.reported[n]

    def kill(self) -> int:
        """SIGKILL it; returns the last commit it reported."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        assert self.process.stdout is not None
        for line in self.process.stdout.read().splitlines(keepends=True):
            if line.endswith(b"\n"):
                self.reported[int(line)] = time.monotonic()
        return self.last


@contextlib.contextmanager
def commit_loop(urls: list[str], replicas: int = 1) -> Iterator[CommitLoop]:
    process = subprocess.Popen([sys.executable, "-m", "tests.integration.nats_commit_loop", ",".join(urls), BUCKET,
                                str(replicas)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield CommitLoop(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def check_committed(urls: list[str], reported: int, replicas: int = 1) -> int:
    """Open the bucket afresh and check it holds exactly commits 1 … n, n the last reported or one
    more (in flight at the kill); returns n."""
    engine = engine_on(urls, BUCKET, replicas)
    await engine.open()
    try:
        found = await observed(engine)
    finally:
        await engine.close()
    position = found["position"]
    assert position in (reported, reported + 1), f"reported {reported}, committed position {position}"
    assert found == expected_after(position)
    return position


def test_commits_wait_out_a_nats_server_killed_and_restarted_on_its_store(own_nats_server: NatsServer) -> None:
    server = own_nats_server
    with commit_loop([server.url]) as loop:
        loop.wait_for(5)
        before = loop.last
        killed = time.monotonic()
        server.kill()
        server.start()
        restarted = time.monotonic()
        resumed = loop.wait_for(before + 2)  # commit before + 1 was in flight at the kill, or came after it
        loop.wait_for(before + 10)
        reported = loop.kill()
    position = asyncio.run(check_committed([server.url], reported))
    print(f"\nnats-server SIGKILLed after commit {before}, back {restarted - killed:.2f} s later; commits resumed "
          f"{resumed - killed:.2f} s after the kill; {position} commits, each applied once")


def test_commits_go_on_when_the_stream_leaders_node_of_a_three_node_cluster_is_killed(
        nats_cluster: NatsCluster) -> None:
    cluster = nats_cluster
    with commit_loop(cluster.urls, replicas=3) as loop:
        loop.wait_for(5)
        leader = asyncio.run(stream_leader(cluster.urls[0]))
        before = loop.last
        killed = time.monotonic()
        cluster.kill(int(leader.removeprefix("n")))
        resumed = loop.wait_for(before + 2)
        loop.wait_for(before + 10)
        cluster.restart(int(leader.removeprefix("n")))
        loop.wait_for(loop.last + 5)
        reported = loop.kill()
    position = asyncio.run(check_committed(cluster.urls, reported, replicas=3))
    print(f"\nR3 stream leader {leader} SIGKILLed after commit {before}; commits resumed {resumed - killed:.2f} s "
          f"later; {position} commits, each applied once")


async def stream_leader(url: str) -> str:
    connection = await nats.connect(url)
    try:
        # A busy 3-node cluster may let one stream info request time out: ask until it answers.
        info = await eventually(lambda: connection.jetstream().stream_info(f"KV_{BUCKET}"),
                                what="the stream's info", ignoring=(nats.errors.Error,), timeout=30)
    finally:
        await connection.close()
    assert info.cluster is not None
    assert info.cluster.leader is not None
    assert len(info.cluster.replicas or []) == 2
    return info.cluster.leader


# -- a lost PubAck ---------------------------------------------------------------------------------


class AnswerDropper:
    """A TCP proxy to a nats-server that, once :meth:`arm`-ed, forwards the next atomic batch's
    commit message to the server, drops the server's answer to it and cuts the connection: the
    batch is stored, its sender never learns it."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.dropped = 0
        self._armed = False
        self._committing = False
        self._server: asyncio.Server | None = None

    def arm(self) -> None:
        self._armed = True

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return f"nats://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        cut = asyncio.Event()

        async def upward() -> None:
            while data := await client_reader.read(65536):
                if self._armed and b"Nats-Batch-Commit" in data:
                    self._armed, self._committing = False, True
                server_writer.write(data)
                await server_writer.drain()

        async def downward() -> None:
            while data := await server_reader.read(65536):
                if self._committing and b'"seq"' in data:  # the PubAck of the commit: never delivered
                    self._committing = False
                    self.dropped += 1
                    cut.set()
                    return
                client_writer.write(data)
                await client_writer.drain()

        pumps = [asyncio.ensure_future(upward()), asyncio.ensure_future(downward()),
                 asyncio.ensure_future(cut.wait())]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        for writer in (client_writer, server_writer):
            writer.close()


@pytest.fixture
async def dropper(nats_server: str) -> AsyncIterator[AnswerDropper]:
    proxy = AnswerDropper(int(nats_server.rsplit(":", 1)[1]))
    await proxy.start()
    yield proxy
    await proxy.stop()


async def delete_bucket(url: str, bucket: str) -> None:
    connection = await nats.connect(url)
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await connection.jetstream().delete_stream(f"KV_{bucket}")
    await connection.close()


async def test_a_commit_whose_answer_was_lost_is_sent_again_and_applied_once(
        dropper: AnswerDropper, nats_server: str) -> None:
    bucket = "egress_it_lost_answer"
    await delete_bucket(nats_server, bucket)
    engine = NatsEngine(f"nats://127.0.0.1:{dropper.port}", PIPELINE, bucket=bucket, request_timeout=1)
    await engine.open()
    try:
        generation = await engine.acquire(CONSUMER, 0)
        await engine.commit(numbered_commit(generation, 1))
        dropper.arm()
        await engine.commit(numbered_commit(generation, 2))  # stored, answer lost, sent again: refused as a replay
        assert dropper.dropped == 1
        await engine.commit(numbered_commit(generation, 3))
        assert await observed(engine) == expected_after(3)
    finally:
        await engine.close()
        await delete_bucket(nats_server, bucket)


# -- an outage longer than outage_timeout ------------------------------------------------------------


async def test_an_outage_longer_than_outage_timeout_raises_nats_unavailable_error_and_the_partition_reloads(
        own_nats_server: NatsServer) -> None:
    server = own_nats_server
    engine = NatsEngine(server.url, PIPELINE, bucket=BUCKET, request_timeout=0.5, outage_timeout=1)
    await engine.open()
    try:
        generation = await engine.acquire(CONSUMER, 0)
        await engine.commit(numbered_commit(generation, 1))
        server.kill()
        with pytest.raises(NatsUnavailableError, match=r"no usable answer for 1 s.*what was committed is kept"):
            await engine.commit(numbered_commit(generation, 2))
        with pytest.raises(NatsUnavailableError):
            await engine.end_offset("out", 0)  # a read asks the server too
        server.start()
        with pytest.raises(NatsEngineError, match="may or may not have been stored; load_checkpoint"):
            await engine.commit(numbered_commit(generation, 2))
        await eventually(lambda: engine.connected, what="nats-py reconnected", interval=0.02)
        assert (await engine.load_checkpoint(CONSUMER, 0, ["http"])).input_positions == {("in", 0): 1}
        await engine.commit(numbered_commit(generation, 2))
        assert await observed(engine) == expected_after(2)
    finally:
        await engine.close()


# -- deleted keys stay deleted through a server SIGKILL, and storage stays bounded ----------------


async def test_a_key_deleted_before_a_server_kill_stays_deleted_after_the_restart(
        own_nats_server: NatsServer) -> None:
    await _deleted_keys_stay_deleted_through_a_kill(own_nats_server, compaction_markers=10**9)


async def test_keys_deleted_and_compacted_away_stay_deleted_after_a_server_kill_and_storage_stays_bounded(
        own_nats_server: NatsServer) -> None:
    """nats-server 2.15.1 does not record a removal on disk until it next writes the stream's state
    (every 2 minutes, or at an orderly shutdown): a SIGKILL before that brings back values replaced
    under max_msgs_per_subject 1 and purged messages alike (measured). Compaction into a new
    generation makes that harmless: what comes back is in a generation no checkpoint names."""
    await _deleted_keys_stay_deleted_through_a_kill(own_nats_server, compaction_markers=20)


async def _deleted_keys_stay_deleted_through_a_kill(server: NatsServer, *, compaction_markers: int) -> None:
    """Write 20 keys and 20 timers and delete them, 40 times over, beside 3 keys and a timer that
    stay; SIGKILL the server and restart it on its store: no deleted key or timer is back, and the
    server holds no state or timer message that can expire (a marker lapsing by ``Nats-TTL`` let the
    value back within 1-2 s, a purged marker at once), and those that stay are there. With
    compaction the state subjects stay bounded, also after the next load of the partition, which
    purges older generations brought back by the kill."""
    engine = NatsEngine(server.url, PIPELINE, bucket=BUCKET, request_timeout=1, retention_period=3600,
                        compaction_markers=compaction_markers)
    await engine.open()
    try:
        generation = await engine.acquire("c", 0)
        kept = {f'["kept-{i}"]'.encode(): b"%d" % i for i in range(3)}
        await engine.commit(EpochCommit("c", 0, generation, {("in", 0): 0},
                                        timers_set=[(b'["kept"]', 1.0, "processing")],
                                        state_writes={("s", key): value for key, value in kept.items()}))
        for n in range(1, 41):  # 20 keys written, then deleted, 40 times over: the server's recent writes
            keys = [f'["k{n}-{i}"]'.encode() for i in range(20)]
            timers = [(key, float(n), "processing") for key in keys]
            await engine.commit(EpochCommit("c", 0, generation, {("in", 0): 2 * n - 1}, timers_set=timers,
                                            state_writes={("s", key): b"1" for key in keys}))
            await engine.commit(EpochCommit("c", 0, generation, {("in", 0): 2 * n}, timers_deleted=timers,
                                            state_writes={("s", key): None for key in keys}))
        expected = ({"s": kept}, [(b'["kept"]', 1.0, "processing")])
        keyed = await engine.load_keyed_state("c", 0, 1, [])
        assert (keyed.internal, keyed.timers) == expected
        bound = 6 + 2 * 40  # the lease, the checkpoint, live keys and timers, and two rounds of writes
        compacting = compaction_markers < 1000
        assert (len(await state_subjects(server)) <= bound) is compacting
        server.kill()
        server.start()
        await eventually(lambda: engine.connected, what="nats-py reconnected", interval=0.02)
        keyed = await engine.load_keyed_state("c", 0, 1, [])
        assert (keyed.internal, keyed.timers) == expected
        # A marker with Nats-TTL let the value back once it lapsed: the server's own record says
        # nothing of the partition's state can lapse, so what the load sees now stays.
        assert await expiring_state(server) == [], "a state or timer message would expire on the server"
        assert (await engine.inventory()).timers == {("c", 0): 1}
        if compacting:  # what the kill brought back of older generations, the load purged
            assert len(await state_subjects(server)) <= bound
    finally:
        await engine.close()


async def expiring_state(server: NatsServer) -> list[str]:
    """What of the test bucket's state and timer subjects the server would remove by itself: each
    subject whose message carries ``Nats-TTL``, and every subject when the stream has a ``max_age``."""
    subjects = await state_subjects(server)
    connection = await nats.connect(server.url)
    try:
        js = connection.jetstream()
        if (await js.stream_info(f"KV_{BUCKET}")).config.max_age:
            return sorted(subjects)
        messages = [await js.get_last_msg(f"KV_{BUCKET}", subject) for subject in subjects]
        return [m.subject for m in messages if "Nats-TTL" in (m.headers or {})]
    finally:
        await connection.close()


async def state_subjects(server: NatsServer) -> dict[str, int]:
    """The state and timer subjects of the test bucket holding a message (a value or a delete marker)."""
    connection = await nats.connect(server.url)
    try:
        info = await connection.jetstream().stream_info(f"KV_{BUCKET}", subjects_filter=f"$KV.{BUCKET}.*.c.>")
        return dict(info.state.subjects or {})
    finally:
        await connection.close()
