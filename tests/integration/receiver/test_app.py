"""``egress receiver`` as a library on a real loopback port."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest

from egress.receiver import Receiver, ReceiverConfig
from tests.conftest import ServerFactory
from tests.receiver_record import recorded

pytestmark = pytest.mark.integration


async def test_a_record_file_in_a_missing_folder_is_created_and_written(tmp_path: Path,
                                                                       serve_app: ServerFactory) -> None:
    record = tmp_path / ".egress" / "received.jsonl"
    base = await serve_app(Receiver(ReceiverConfig(record=record)).app)
    request = urllib.request.Request(f"{base}/events", data=b"hello", headers={"Idempotency-Key": "K1"})

    status = await asyncio.to_thread(lambda: urllib.request.urlopen(request).status)

    assert status == 200
    lines = recorded(record)
    assert [line["idempotency_key"] for line in lines] == ["K1"]
