"""``egress receiver``'s hold: it answers a chosen count of requests, then holds every further one
unanswered until told to answer more, so a test can act while a run is provably mid-way."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from typer.testing import CliRunner

from egress.cli.main import app
from egress.receiver import Receiver, ReceiverConfig, serve
from tests.conftest import ServerFactory
from tests.receiver_record import recorded, recorded_count
from tests.waiting import eventually

pytestmark = pytest.mark.integration

DEADLINE = 30.0  # seconds: a failure guard only, every wait below ends on a positive signal


async def stats(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with session.get(f"{base}/stats") as answer:
        found: dict[str, Any] = await answer.json()
        return found


def answered(tasks: list[asyncio.Task[int]]) -> int:
    return sum(1 for task in tasks if task.done())


async def post_all(session: aiohttp.ClientSession, base: str, count: int) -> list[asyncio.Task[int]]:
    async def post(number: int) -> int:
        async with session.post(f"{base}/events", data=f"event {number}",
                                headers={"Idempotency-Key": f"K{number}"}) as answer:
            return answer.status

    return [asyncio.create_task(post(number)) for number in range(count)]


async def test_it_answers_hold_after_requests_then_holds_the_rest_until_told_to_answer_more(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    record = tmp_path / "received.jsonl"
    base = await serve_app(Receiver(ReceiverConfig(record=record, hold_after=2)).app)
    async with aiohttp.ClientSession() as session:
        tasks = await post_all(session, base, 5)

        async def held(count: int) -> bool:
            return int((await stats(session, base))["held"]) == count

        await eventually(lambda: held(3), what="three requests held")
        counts = await stats(session, base)
        assert (counts["requests"], counts["delivered"], answered(tasks)) == (2, 2, 2)
        assert recorded_count(record) == 2  # a held request is recorded once answered

        async with session.post(f"{base}/hold?after=1") as answer:
            assert answer.status == 200
        await eventually(lambda: held(2), what="one held request answered")

        async def three_answered() -> bool:
            return answered(tasks) == 3

        await eventually(three_answered, what="its answer")
        assert (await stats(session, base))["requests"] == 3

        async with session.post(f"{base}/release") as answer:
            assert (await answer.json())["requests"] >= 3
        assert await asyncio.gather(*tasks) == [200] * 5
        counts = await stats(session, base)
        assert (counts["requests"], counts["distinct_keys"], counts["held"]) == (5, 5, 0)
        async with session.post(f"{base}/events", data="later") as answer:  # released: no more holding
            assert answer.status == 200
    lines = recorded(record)
    assert sorted(line["idempotency_key"] for line in lines if line["idempotency_key"]) == [f"K{n}" for n in range(5)]


async def test_hold_after_zero_holds_the_first_request_and_a_bad_count_is_a_400(serve_app: ServerFactory) -> None:
    base = await serve_app(Receiver(ReceiverConfig()).app)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/hold?after=none") as answer:
            assert answer.status == 400
            assert "give a count of requests, e.g. /hold?after=100" in await answer.text()
        async with session.post(f"{base}/hold") as answer:  # after=0: hold from the next request on
            assert (await answer.json())["held"] == 0
        tasks = await post_all(session, base, 1)

        async def one_held() -> bool:
            return int((await stats(session, base))["held"]) == 1

        await eventually(one_held, what="the request held")
        assert (answered(tasks), (await stats(session, base))["requests"]) == (0, 0)
        async with session.post(f"{base}/release"):
            pass
        assert await asyncio.gather(*tasks) == [200]


async def test_a_stopping_receiver_answers_what_it_holds(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    ready, stop = asyncio.Event(), asyncio.Event()
    server = asyncio.create_task(serve(ReceiverConfig(hold_after=0), "127.0.0.1", port, ready, stop))
    await asyncio.wait_for(ready.wait(), DEADLINE)
    async with aiohttp.ClientSession() as session:
        tasks = await post_all(session, base, 2)

        async def two_held() -> bool:
            return int((await stats(session, base))["held"]) == 2

        await eventually(two_held, what="two requests held")
        stop.set()
        assert await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE) == [200, 200]
    await asyncio.wait_for(server, DEADLINE)


def test_hold_after_is_refused_for_the_firehose_receiver() -> None:
    result = CliRunner().invoke(app, ["receiver", "--protocol", "firehose", "--hold-after", "3"])
    assert result.exit_code == 2
    assert "only the generic receiver holds requests" in result.output
