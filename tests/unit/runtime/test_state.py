"""Keyed internal and external state through egress.testing: values, clear, models, and the
errors a user gets for a value that cannot be stored or a column that does not exist."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import BaseModel

from egress import InitContext, Message, OutputCollector, ProcessFunction, RuntimeContext
from egress.errors import ProcessFunctionError
from egress.keys import encode_key, partition_of
from egress.runtime.state import StateStore
from egress.testing import ProcessFunctionHarness


@dataclasses.dataclass
class Count:
    n: int = 0
    last: Any = None


class Counter(ProcessFunction):
    """Counts messages per key in a dataclass state; ``{"clear": true}`` clears it; ``last`` keeps
    the row's ``value`` (whatever it is); the external table gets ``total`` and ``label``."""

    def init(self, ctx: InitContext) -> None:
        self.counts = ctx.state_client("counts", Count)
        self.table = ctx.external_state_client("totals", {"total": int, "label": str})

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        state = self.counts.get(message.key)
        if message.row.get("clear"):
            state.clear()
            return
        state.value.n += 1
        state.value.last = message.row.get("value")
        row = self.table.get(message.key)
        row.set_column("total", (row.get_column("total") or 0) + 1)
        if "label" in message.row:
            row.set_column("label", message.row["label"])


async def test_values_persist_per_key_and_clear_deletes() -> None:
    h = ProcessFunctionHarness(Counter)
    for key in [("a",), ("b",), ("a",)]:
        await h.process_message({"value": 1}, key=key)
    assert h.state("counts", ("a",)) == Count(2, 1)
    assert h.state("counts", ("b",)) == Count(1, 1)
    assert h.external_state("totals", ("a",)) == {"total": 2}
    await h.process_message({"clear": True}, key=("a",))
    assert h.state("counts", ("a",)) is None
    assert h.external_state("totals", ("a",)) == {"total": 2}  # external rows are the user's


async def test_a_value_that_cannot_be_stored_names_state_key_and_message() -> None:
    h = ProcessFunctionHarness(Counter)
    with pytest.raises(ProcessFunctionError) as raised:
        await h.process_message({"value": object()}, key=("k",))
    text = str(raised.value)
    assert "state 'counts' for key ['k'] cannot be serialised" in text
    assert "of stream 'input' with key ['k']" in text


async def test_external_columns_are_typed_and_named() -> None:
    h = ProcessFunctionHarness(Counter)
    with pytest.raises(ProcessFunctionError, match="column 'label' is str, got int"):
        await h.process_message({"label": 5}, key=("k",))

    class Unknown(Counter):
        async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
            self.table.get(message.key).set_column("missing", 1)

    with pytest.raises(ProcessFunctionError, match="has no column 'missing'"):
        await ProcessFunctionHarness(Unknown).process_message({}, key=("k",))


class Pair(BaseModel):
    left: int
    right: int


def test_pydantic_values_round_trip_and_models_without_defaults_need_set() -> None:
    store = StateStore()
    client = store.state_client("pairs", Pair)
    store.begin(("k",))
    accessor = client.get(("k",))
    assert not accessor.exists
    with pytest.raises(TypeError, match=r"Pair\(\) cannot be built without arguments"):
        _ = accessor.value
    accessor.set(Pair(left=1, right=2))
    with pytest.raises(TypeError, match="holds Pair, got dict"):
        accessor.set({"left": 1})  # type: ignore[arg-type]
    store.end("a test")
    writes, _ = store.take_writes()
    assert writes == {("pairs", b'["k"]'): b'{"left":1,"right":2}'}
    again = StateStore()
    loaded = again.state_client("pairs", Pair)
    again.load({"pairs": {b'["k"]': b'{"left":1,"right":2}'}}, {})
    assert loaded.peek(("k",)) == Pair(left=1, right=2)


def test_state_of_another_partition_is_refused() -> None:
    store = StateStore(partition=0, partition_count=8)
    client = store.state_client("s", Count)
    store.begin(("mine",))
    foreign = next(k for k in (("x", i) for i in range(100)) if partition_of(encode_key(k), 8) != 0)
    with pytest.raises(KeyError, match="belongs to another partition"):
        client.get(foreign)
    with pytest.raises(ValueError, match="initialised twice"):
        store.state_client("s", Count)


async def test_a_str_column_of_external_state_keeps_bytes_exactly() -> None:
    """Flow's strings are byte strings: an external ``str`` column holds text or bytes, stored as they are."""
    every_byte = bytes(range(256))
    h = ProcessFunctionHarness(Counter)
    await h.process_message({"label": every_byte}, key=("k",))
    await h.process_message({"label": "text"}, key=("t",))
    assert h.external_state("totals", ("k",)) == {"total": 1, "label": every_byte}
    store = StateStore()
    table = store.external_state_client("totals", {"label": str})
    store.begin(("k",))
    table.get(("k",)).set_column("label", every_byte)
    store.end(lambda: "a test")
    _, writes = store.take_writes()
    again = StateStore()
    loaded = again.external_state_client("totals", {"label": str})
    again.load({}, {"totals": {key: value for (_, key), value in writes.items() if value is not None}})
    assert loaded.peek(("k",)) == {"label": every_byte}
