"""The real variant of the retryable example: attempts are HTTP POSTs to a local service that
fails transiently; requests that keep failing go to the dead-letter stream after max_attempts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest
import yaml
from examples.retryable_async_request.functions import request_id_of
from examples.retryable_async_request.service import ATTEMPTS, create_app

from egress.cli.state import state_lines
from egress.keys import source_message_id, source_scope
from egress.runtime import Pipeline, RunOptions, load_plan
from tests.conftest import REPO, ServerFactory

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "retryable_async_request"
MAX_ATTEMPTS = 3


async def test_transient_failures_are_retried_and_poison_requests_dead_lettered(
        tmp_path: Path, serve_app: ServerFactory) -> None:
    app = create_app()
    base = await serve_app(app)
    events = [{"key": f"k{i % 4}", "data": ("poison " if i % 10 == 3 else "") + "x" * i} for i in range(40)]
    (tmp_path / "events.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    spec = yaml.safe_load((EXAMPLE / "http_spec.yaml").read_text())
    spec["sources"]["events"]["parameters"]["path"] = str(tmp_path / "events.jsonl")
    spec["computations"]["request_processor"]["processing_function_parameters"].update(
        url=f"{base}/requests", delay="20ms", max_attempts=MAX_ATTEMPTS)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = await Pipeline(load_plan(tmp_path / "spec.yaml"), tmp_path / "state",
                            options=RunOptions(until_drained=True)).run()
    assert result.ok, result
    assert result.drained

    expected: Counter[str] = Counter()
    for event in events:
        if "poison" not in event["data"]:
            expected[event["key"]] += len(event["data"])
    state = tmp_path / "state"
    assert {line["key"][0]: line["row"]["total_length"] for line in state_lines(state, name="/state")} == expected
    dead = {(line["key"][1]): line["row"] for line in state_lines(state, name="/dead_letter")}
    scope = source_scope(spec["pipeline"], "events", spec["sources"]["events"]["parameters"]["path"])
    poison_ids = {request_id_of(source_message_id(scope, 0, i))
                  for i, event in enumerate(events) if "poison" in event["data"]}
    assert set(dead) == poison_ids
    assert {row["attempts"] for row in dead.values()} == {MAX_ATTEMPTS}
    assert {row["error"] for row in dead.values()} == {"HTTP 500"}
    attempts: Counter[int] = app[ATTEMPTS]
    assert all(attempts[i] == MAX_ATTEMPTS for i in poison_ids)
    # Others succeed on attempt request_id % 3 + 1 (< MAX_ATTEMPTS), so no request is sent again.
    assert all(n == i % 3 + 1 for i, n in attempts.items() if i not in poison_ids)
    assert list(state_lines(state, name="request_state")) == []
