"""A worker cut off from NATS by a network partition (a loopback TCP proxy between it and the
server stops forwarding: its connections are cut and new ones refused, then let through again):
its leases lapse and the other worker runs its units within the TTL, a heartbeat and an epoch; its
commits are fenced when the network returns (no log message appended twice), and it rejoins and
gets its share back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import pytest

from egress.engines.nats import NatsEngine
from egress.receiver import Receiver, ReceiverConfig
from egress.runtime import Pipeline, load_plan
from egress.runtime.pipeline import nats_engine_factory
from tests.conftest import ServerFactory
from tests.integration.runtime.test_worker import (
    HEARTBEAT,
    LOADED,
    OPTIONS,
    PARTITIONS,
    TTL,
    UNITS,
    expected_keys,
    make_cluster,
    ok,
)
from tests.loopback_proxy import relay
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class NetworkPartition:
    """A TCP proxy on 127.0.0.1 to ``upstream_port`` that :meth:`cut` partitions (every connection
    through it closed, new ones closed at once) until :meth:`heal`."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.cut_off = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return f"nats://127.0.0.1:{self.port}"

    def cut(self) -> None:
        self.cut_off = True
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    def heal(self) -> None:
        self.cut_off = False

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            client_writer.close()
            return
        server = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while not self.cut_off and (data := await reader.read(65536)):
                    writer.write(data)
                    await writer.drain()

        await relay((client_reader, client_writer), server, pump, self._writers)


async def log_ends(url: str, pipeline: str, stream: str) -> int:
    """The messages the pipeline's log holds in ``stream`` over every partition (its end offsets)."""
    engine = NatsEngine(url, pipeline)
    await engine.open()
    try:
        return sum([await engine.end_offset(stream, partition) for partition in range(PARTITIONS)])
    finally:
        await engine.close()


async def test_a_worker_cut_off_from_nats_loses_its_units_is_fenced_and_rejoins_when_the_network_returns(
        tmp_path: Path, serve_app: ServerFactory, nats_server: str) -> None:
    receiver = Receiver(ReceiverConfig(delay=0.02))  # the run lasts through the partition
    count = 1500  # about 15 s at the receiver's pace: the cut, the failover and the rejoin fit in
    cluster = make_cluster(tmp_path, "nats", f"{await serve_app(receiver.app)}/events", count)
    partition = NetworkPartition(int(nats_server.rsplit(":", 1)[1]))
    cut_url = await partition.start()
    try:
        a = Pipeline(load_plan(cluster.spec, cluster.dynamic), cluster.state, options=OPTIONS,
                     engine_factory=nats_engine_factory([cut_url]), worker_id="worker-a")
        b = cluster.worker("worker-b")
        runs = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
        await eventually(lambda: len(a.units.running) >= UNITS // 2 and len(b.units.running) >= UNITS // 2
                         and receiver.stats.requests >= 200, timeout=LOADED, what="both workers run their share")
        assert a.worker is not None
        assert b.worker is not None
        held, taken = set(a.units.running), len(a.worker.taken)
        partition.cut()
        cut = time.monotonic()
        await eventually(lambda: held <= set(b.units.running), timeout=LOADED, what="worker-b runs worker-a's units")
        failover = time.monotonic() - cut
        print(f"\nworker-a cut off from NATS: its {len(held)} units running on worker-b {failover:.2f} s later "
              f"(lease TTL {TTL:g} s, heartbeat {HEARTBEAT:g} s)")
        assert failover <= TTL + HEARTBEAT + 2.0  # plus one epoch and the NATS TTL's 1 s granularity
        assert time.monotonic() - cut >= TTL - 1.0  # not before its leases could lapse
        partition.heal()
        healed = time.monotonic()
        await eventually(lambda: len(a.worker.taken) > taken, timeout=LOADED,  # type: ignore[union-attr]
                         what="worker-a takes units again")
        rejoined = time.monotonic() - healed
        print(f"worker-a took units again {rejoined:.2f} s after the network returned; lost {a.worker.lost}")
        results = await asyncio.wait_for(asyncio.gather(*runs), 4 * LOADED)
        assert all(ok(result) for result in results), results
        assert {unit for unit, _ in a.worker.lost} == held  # each lease lost: renewal refused or commit fenced
        assert healed > cut
        assert set(receiver.stats.delivered_keys) == expected_keys(cluster, count)
        # The source reader's appends, once each: a commit of worker-a after the partition was fenced.
        assert await log_ends(os.environ["EGRESS_TEST_NATS_URL"], cluster.pipeline, "events") == count
    finally:
        await partition.stop()
