"""The order rule of what a sink's ``distribute`` is handed (``connectors/sinks/ordering.py``)."""

from __future__ import annotations

import pytest

from egress.connectors.sinks.ordering import fresh_messages
from egress.engines import OutboxMessage


def outbox(*seqs: int) -> list[OutboxMessage]:
    return [OutboxMessage(seq, "out", bytes([seq]), b"", None, {"payload": str(seq)}) for seq in seqs]


def test_messages_at_or_below_the_persisted_seq_are_skipped() -> None:
    assert [m.seq for m in fresh_messages(outbox(1, 2, 3, 4), persisted_seq=2, last_distributed_seq=2)] == [3, 4]


def test_a_seq_not_above_the_last_distributed_is_refused() -> None:
    with pytest.raises(ValueError, match="message seq 3 is not greater than the last distributed 3"):
        fresh_messages(outbox(3, 4), persisted_seq=1, last_distributed_seq=3)


def test_a_seq_out_of_order_within_one_call_is_refused() -> None:
    with pytest.raises(ValueError, match="message seq 4 is not greater than the last distributed 5"):
        fresh_messages(outbox(3, 5, 4), persisted_seq=0, last_distributed_seq=2)


def test_nothing_to_distribute_is_nothing_fresh() -> None:
    assert fresh_messages([], persisted_seq=0, last_distributed_seq=0) == []
