"""The batching HTTP sink on the virtual clock: how batches form (events, bytes, delay), how they are
encoded (JSON lines, JSON array, raw, gzip), the idempotency key of a batch, and batches re-formed
from committed boundaries (``sink_state``).

The transport is scripted (tests/unit/connectors/sinks/test_async_http_delivery.py's): these tests are about the sink's
decisions; tests/integration/connectors/sinks/test_batching_http.py checks the delivery rules against a real
aiohttp endpoint, tests/integration/connectors/sinks/test_batching_http_kill.py a SIGKILL.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from typing import Any

import pytest

from egress.clock import VirtualClock
from egress.connectors.base import SinkContext
from egress.connectors.sinks.batches import decode_batch_ends
from egress.connectors.sinks.batching_http import BatchingHttpSink, batch_idempotency_key
from egress.connectors.sinks.batching_parameters import BatchingHttpSinkDynamicParameters, BatchingHttpSinkParameters
from egress.engines import OutboxMessage, SinkProgress
from egress.errors import SpecErrors
from egress.httpclient import Request
from egress.keys import idempotency_key
from egress.observe import Metrics, StatusTree
from egress.spec import validate_model
from tests.unit.connectors.sinks.test_async_http_delivery import Outcome, ScriptedTransport

URL = "http://receiver.test/bulk"


class Harness:
    """One sink instance on a virtual clock with a scripted transport (200 unless ``script`` says)."""

    def __init__(self, static: dict[str, Any] | None = None, *, progress: SinkProgress | None = None,
                 script: Callable[[Request, int], Outcome] = lambda request, n: Outcome(),
                 clock: VirtualClock | None = None) -> None:
        self.clock = clock or VirtualClock(0.0)
        self.metrics = Metrics()
        self.transport = ScriptedTransport(self.clock, script)
        context = SinkContext("deliver", "bulk", 0, self.clock, self.metrics, StatusTree(), lambda _progress: None)
        self.parameters = BatchingHttpSinkParameters.model_validate(
            {"url": URL, "payload_column": "p", "max_delay": 0, **(static or {})})
        self.sink = BatchingHttpSink(context, self.parameters,
                                     BatchingHttpSinkDynamicParameters(retry_jitter_ratio=0.0),
                                     progress or SinkProgress(), transport_factory=lambda scheme, p: self.transport)

    def commit(self) -> SinkProgress:
        """What a partition job does each epoch: take the acknowledged prefix, commit it, tell the sink."""
        progress = self.sink.progress()
        self.sink.committed(progress)
        return progress

    async def settle(self, limit: float = 300.0) -> None:
        """Commit every 10 ms of virtual time until every message is acknowledged or the sink is stopped
        by a terminal failure (at most ``limit`` virtual seconds)."""
        async with self.clock.autojumping():
            while self.clock.now() < limit:
                self.commit()
                if self.sink.unacknowledged == 0:
                    break
                if self.sink.terminal_error is not None:  # what is before it still goes out
                    await self.clock.sleep(1.0)
                    self.commit()
                    break
                await self.clock.sleep(0.01)

    def bodies(self) -> list[bytes]:
        return [request.body for _, request in self.transport.sent]

    def header(self, index: int, name: str) -> str | None:
        prefix = f"{name.lower()}: "
        _, request = self.transport.sent[index]
        return next((h[len(prefix):] for h in request.headers if h.lower().startswith(prefix)), None)


def messages(payloads: list[Any], start: int = 1) -> list[OutboxMessage]:
    return [OutboxMessage(seq, "events", f"id-{seq:04d}".encode(), b"[]", None, {"p": payload})
            for seq, payload in enumerate(payloads, start=start)]


def events(count: int, start: int = 0) -> list[str]:
    return [json.dumps({"flight": i}) for i in range(start, start + count)]


# -- formation ---------------------------------------------------------------------------------------


async def test_a_batch_closes_at_max_events() -> None:
    h = Harness({"max_events": 3})
    h.sink.distribute(messages(events(7)))
    await h.settle()
    assert [body.count(b"\n") for body in h.bodies()] == [3, 3, 1]
    assert h.sink.progress().max_persisted_seq_no == 7


async def test_a_batch_closes_before_its_encoded_body_would_pass_max_bytes() -> None:
    h = Harness({"max_bytes": 35, "encoding": "raw"})  # raw: 9 bytes each, so 3 fit (27), a 4th (36) does not
    h.sink.distribute(messages(['"' + "x" * 7 + '"'] * 4))
    await h.settle()
    assert [len(body) for body in h.bodies()] == [27, 9]
    lines = Harness({"max_bytes": 30})  # JSON lines: 10 bytes each with its newline: exactly 3 fit
    lines.sink.distribute(messages(['"' + "x" * 7 + '"'] * 4))
    await lines.settle()
    assert [len(body) for body in lines.bodies()] == [30, 10]


async def test_a_record_larger_than_max_bytes_is_sent_alone() -> None:
    h = Harness({"max_bytes": 20})
    big = '"' + "y" * 40 + '"'
    h.sink.distribute(messages(['"a"', big, '"b"']))
    await h.settle()
    assert h.bodies() == [b'"a"\n', big.encode() + b"\n", b'"b"\n']


async def test_a_batch_closes_max_delay_after_its_first_record() -> None:
    h = Harness({"max_delay": "2s", "max_events": 100})
    async with h.clock.autojumping():
        h.sink.distribute(messages(events(2)))
        h.commit()
        await h.clock.sleep(1.5)
        h.sink.distribute(messages(events(1, 2), start=3))
        h.commit()
        assert h.transport.sent == [], "nothing is sent before max_delay"
        while not h.transport.sent and h.clock.now() < 60:
            h.commit()
            await h.clock.sleep(0.01)
    assert h.transport.sent[0][0] == pytest.approx(2.0, abs=0.02), "sent max_delay after its first record"
    assert h.bodies()[0].count(b"\n") == 3


async def test_nulls_are_no_records_and_are_acknowledged_in_order() -> None:
    h = Harness({"max_events": 2})
    h.sink.distribute(messages([None, '"a"', None, '"b"', None]))
    await h.settle()
    assert h.bodies() == [b'"a"\n"b"\n']
    assert h.sink.progress().max_persisted_seq_no == 5


# -- encodings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("encoding", "body", "content_type"), [
    ("json_lines", b'{"a":1}\n[2]\n"three"\n', "application/x-ndjson"),
    ("json_array", b'[{"a":1},[2],"three"]', "application/json"),
    ("raw", b'{"a":1}[2]"three"', None),
])
async def test_each_encoding_makes_its_body_and_content_type(encoding: str, body: bytes,
                                                              content_type: str | None) -> None:
    h = Harness({"encoding": encoding})
    h.sink.distribute(messages(['{"a":1}', b"[2]", '"three"']))
    await h.settle()
    assert h.bodies() == [body]
    assert h.header(0, "Content-Type") == content_type
    assert h.header(0, "Content-Encoding") is None


async def test_a_content_type_in_headers_replaces_the_encodings() -> None:
    h = Harness({"encoding": "raw", "headers": {"Content-Type": "text/plain"}})
    h.sink.distribute(messages(["a", "b"]))
    await h.settle()
    _, request = h.transport.sent[0]
    assert [line for line in request.headers if line.lower().startswith("content-type")] == [
        "Content-Type: text/plain"]


async def test_gzip_compresses_the_encoded_body_and_says_so() -> None:
    h = Harness({"content_encoding": "gzip", "encoding": "json_array"})
    h.sink.distribute(messages(events(50)))
    await h.settle()
    (body,) = h.bodies()
    assert h.header(0, "Content-Encoding") == "gzip"
    assert json.loads(gzip.decompress(body)) == [{"flight": i} for i in range(50)]
    assert len(body) < len(gzip.decompress(body))


async def test_a_payload_that_is_not_one_json_line_fails_with_the_fix() -> None:
    h = Harness()
    h.sink.distribute(messages(['"a"', '{\n"b": 1}']))
    await h.settle()
    assert h.bodies() == [b'"a"\n']
    assert h.sink.terminal_error is not None
    assert "contains a newline" in h.sink.terminal_error
    assert "encoding json_array or raw" in h.sink.terminal_error


# -- the idempotency key -----------------------------------------------------------------------------


async def test_a_batch_is_keyed_by_its_first_and_last_message_ids_on_every_attempt() -> None:
    h = Harness({"max_events": 3}, script=lambda request, n: Outcome(503 if n == 1 else 200))
    h.sink.distribute(messages(events(3)))
    await h.settle()
    assert len(h.transport.sent) == 2, "one retry"
    key = f"{idempotency_key(b'id-0001')}-{idempotency_key(b'id-0003')}"
    assert batch_idempotency_key(b"id-0001", b"id-0003") == key
    assert [h.header(i, "Idempotency-Key") for i in range(2)] == [key, key]
    assert h.bodies()[0] == h.bodies()[1]


async def test_an_empty_idempotency_header_sends_no_key() -> None:
    h = Harness({"idempotency_header": ""})
    h.sink.distribute(messages(events(2)))
    await h.settle()
    assert h.header(0, "Idempotency-Key") is None


# -- committed boundaries ----------------------------------------------------------------------------


async def test_a_closed_batch_is_sent_only_once_its_boundary_is_committed() -> None:
    h = Harness({"max_events": 2})
    async with h.clock.autojumping():
        h.sink.distribute(messages(events(2)))
        await h.clock.sleep(1.0)
        assert h.transport.sent == [], "sent before its boundary was committed"
        progress = h.sink.progress()
        assert decode_batch_ends(progress.sink_state) == [2]
        h.sink.committed(progress)
        await h.clock.sleep(0.01)
    assert len(h.transport.sent) == 1


async def test_a_new_instance_reforms_the_committed_batches_whatever_the_bounds_are_now() -> None:
    first = Harness({"max_events": 3}, script=lambda request, n: Outcome(503))
    first.sink.distribute(messages(events(7)))
    progress = first.commit()  # the ends 3, 6 and 7 committed: the batches go out and fail
    assert decode_batch_ends(progress.sink_state) == [3, 6, 7]
    async with first.clock.autojumping():
        while len(first.transport.sent) < 3:
            await first.clock.sleep(0.01)
    before = {first.header(i, "Idempotency-Key"): body for i, body in enumerate(first.bodies())}
    await first.sink.close()

    second = Harness({"max_events": 100, "max_bytes": "1MiB"}, progress=progress)  # a restart, other bounds
    second.sink.distribute(messages(events(9)))  # the 7 again, and 2 new
    await second.settle()
    after = {second.header(i, "Idempotency-Key"): body for i, body in enumerate(second.bodies())}
    assert set(before) <= set(after)
    assert all(after[key] == body for key, body in before.items()), "a key came back with another body"
    assert [body.count(b"\n") for body in second.bodies()] == [3, 3, 1, 2]
    assert second.sink.progress().max_persisted_seq_no == 9


async def test_redrive_reforms_the_letters_of_each_batch_under_its_key() -> None:
    from egress.connectors.dead_letters import DeadLetter

    letters = [DeadLetter("deliver", "bulk", 0, seq, b"m", key, b"1", (), "x", 0.0)
               for seq, key in [(1, "A"), (2, "A"), (3, "B"), (4, "C"), (5, "C")]]
    assert decode_batch_ends(BatchingHttpSink.redrive_progress(letters).sink_state) == [2, 3, 5]


# -- parameters --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("parameters", "path", "message"), [
    ({"encoding": "ndjson"}, "encoding", "'json_lines', 'json_array' or 'raw'"),
    ({"max_bytes": "1GiB"}, "max_bytes", "1GiB is more than the limit, 0.0625GiB (64MiB)"),
    ({"max_bytes": "100MiB"}, "max_bytes", "100MiB is more than the limit, 64MiB"),
    ({"max_bytes": "100MB"}, "max_bytes", "100MB is more than the limit, 67.108864MB (64MiB)"),
    ({"max_bytes": 67108865}, "max_bytes", "67,108,865 bytes is more than the limit, 67,108,864 bytes (64MiB)"),
    ({"max_bytes": "0KiB"}, "max_bytes", "0KiB is less than the least, 1 byte"),
    ({"max_bytes": "1TB"}, "max_bytes", "cannot read '1TB' as a size: write a number of bytes, like 1048576, or "
                                        "digits with a unit: B; KB, MB, GB (1000s); KiB, MiB, GiB (1024s)"),
    ({"max_events": 0}, "max_events", "max_events must be at least 1, got 0"),
    ({"max_delay": "1x"}, "max_delay", "write a duration like 100ms"),
    ({"content_encoding": "br"}, "content_encoding", "'none' or 'gzip'"),
    ({"headers": {"content-encoding": "gzip"}}, "", "set content_encoding: gzip to compress it"),
    ({"url": "ftp://x"}, "url", "Batching HTTP sink URL must use http or https"),
    ({"at_most_once_strategy": {"x": 1}}, "at_most_once_strategy",
     "Batching HTTP sink does not support at_most_once_strategy"),
])
def test_bad_parameters_are_named_by_path_with_the_fix(parameters: dict[str, Any], path: str, message: str) -> None:
    prefix = "computations/deliver/sinks/bulk/parameters"
    with pytest.raises(SpecErrors) as raised:
        validate_model(BatchingHttpSinkParameters, {"url": URL, "payload_column": "p", **parameters},
                       file="spec.yaml", prefix=prefix)
    (error,) = raised.value.errors
    assert error.file == "spec.yaml"
    assert error.path == "/".join(p for p in (prefix, path) if p)
    assert message in error.message


def test_sizes_take_units_and_defaults_hold() -> None:
    parameters = BatchingHttpSinkParameters.model_validate({"url": URL, "payload_column": "p", "max_bytes": "512KiB"})
    assert parameters.max_bytes == 512 * 1024
    defaults = BatchingHttpSinkParameters.model_validate({"url": URL, "payload_column": "p"})
    assert (defaults.max_events, defaults.max_bytes, defaults.max_delay, defaults.encoding,
            defaults.content_encoding) == (1000, 1024 * 1024, 1.0, "json_lines", "none")
