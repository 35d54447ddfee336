"""End to end: ``egress run`` reading a JetStream stream that is published into all the while,
SIGKILLed and restarted 5 times, then run ``--until-drained``: every message published reaches the
receiver under the key derived from (stream, sequence), with its own body; none is skipped."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest
from nats.js.api import StreamConfig

from egress.keys import derived_message_id, idempotency_key, source_message_id, source_scope
from tests.e2e.conftest import Receiver
from tests.e2e.live_inputs import kill_restart_then_drain, pass_through_spec
from tests.e2e.runtime.test_kill_restart import load_record
from tests.nats_publisher import Publisher
from tests.waiting import eventually_sync

pytestmark = pytest.mark.e2e

PIPELINE, SOURCE = "nats_kill", "input"
PUBLISHED_PER_RUN = 250  # messages published before each kill, at the least: 5 kills see 1,250


def expected(stream: str, count: int) -> dict[str, str]:
    """Key → sha256 of the body of each of the ``count`` messages (sequence = id + 1)."""
    scope = source_scope(PIPELINE, SOURCE, stream)
    return {idempotency_key(derived_message_id(source_message_id(scope, 0, i + 1), 0)):
            hashlib.sha256(f"order {i}".encode()).hexdigest() for i in range(count)}


@pytest.mark.timeout(240)
def test_a_stream_published_into_across_five_sigkills_is_delivered_whole(
        tmp_path: Path, receiver: Receiver, nats_server: str) -> None:
    stream = f"kill_{uuid.uuid4().hex[:12]}"
    publisher = Publisher(nats_server, StreamConfig(name=stream, subjects=[f"{stream}.>"]),
                          lambda _: f"{stream}.new")
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
