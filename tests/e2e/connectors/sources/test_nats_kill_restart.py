"""End to end: ``egress run`` reading a JetStream stream that is published into all the while,
SIGKILLed and restarted 5 times, then run ``--until-drained``: every message published reaches the
receiver under the key derived from (stream, sequence), with its own body; none is skipped."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import uuid
from pathlib import Path

import nats
import orjson
import pytest

from egress.keys import derived_message_id, idempotency_key, source_message_id, source_scope
from tests.e2e.conftest import Receiver
from tests.e2e.live_inputs import kill_restart_then_drain, pass_through_spec
from tests.e2e.runtime.test_kill_restart import load_record
from tests.waiting import eventually_sync

pytestmark = pytest.mark.e2e

PIPELINE, SOURCE = "nats_kill", "input"
PUBLISHED_PER_RUN = 250  # messages published before each kill, at the least: 5 kills see 1,250


class Publisher:
    """Publishes ``{"id": i, "payload": "order i"}`` to ``stream`` in order, about 1,000 a second,
    on its own thread and event loop, until :meth:`stop`; ``count`` says how many were acknowledged."""

    def __init__(self, url: str, stream: str) -> None:
        self.url, self.stream = url, stream
        self.count = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._publish()), daemon=True)

    def start(self) -> None:
        """Start publishing once the stream exists (so the first run finds it)."""
        self._thread.start()
        assert self._ready.wait(timeout=30), "the stream was not created"

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.count

    async def _publish(self) -> None:
        client = await nats.connect(self.url)
        js = client.jetstream()
        await js.add_stream(name=self.stream, subjects=[f"{self.stream}.>"])
        self._ready.set()
        while not self._stop.is_set():
            for _ in range(20):
                message = {"id": self.count, "payload": f"order {self.count}"}
                await js.publish(f"{self.stream}.new", orjson.dumps(message))
                self.count += 1
            await asyncio.sleep(0.02)
        await client.close()


def expected(stream: str, count: int) -> dict[str, str]:
    """Key → sha256 of the body of each of the ``count`` messages (sequence = id + 1)."""
    scope = source_scope(PIPELINE, SOURCE, stream)
    return {idempotency_key(derived_message_id(source_message_id(scope, 0, i + 1), 0)):
            hashlib.sha256(f"order {i}".encode()).hexdigest() for i in range(count)}


@pytest.mark.timeout(240)
def test_a_stream_published_into_across_five_sigkills_is_delivered_whole(
        tmp_path: Path, receiver: Receiver, nats_server: str) -> None:
    stream = f"kill_{uuid.uuid4().hex[:12]}"
    publisher = Publisher(nats_server, stream)
    publisher.start()
    try:
        published = kill_restart_then_drain(
            tmp_path, receiver,
            lambda run: pass_through_spec(tmp_path, PIPELINE, {"source_class_name": "nats",
                                                               "parameters": {"url": nats_server, "stream": stream}},
                                          receiver.port, run),
            publisher.stop, lambda run: eventually_sync(lambda: publisher.count >= PUBLISHED_PER_RUN * (run + 1),
                                                        what=f"{PUBLISHED_PER_RUN * (run + 1)} messages published"))
    finally:
        publisher.stop()

    requests = [r for r in load_record(receiver.record) if 200 <= r.status <= 299]
    bodies = {r.key: r.body for r in requests}
    want = expected(stream, published)
    missing = want.keys() - bodies.keys()
    assert published > 1000
    assert not missing, f"{len(missing)} of {published} messages never delivered, e.g. {sorted(missing)[:5]}"
    assert bodies.keys() == want.keys()
    assert bodies == want
    print(f"\n{published} messages published, {len(requests)} requests ({len(requests) - published} resent)")
