"""A process function that raises once the receiver has answered what was committed before it.

For ``test_stop_on_error``: the run must stop with acknowledgements received but not yet committed,
which is only certain when the failure waits for them (a positive signal, not a sleep).
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request

from egress import Message, OutputCollector, ProcessFunction, RuntimeContext

FAIL_AT = "EGRESS_TEST_FAIL_AT"
"""Environment: the ``id`` to raise on (unset: never raise)."""
STATS_URL = "EGRESS_TEST_STATS_URL"
"""Environment: the receiver's ``/stats`` URL."""
ANSWERED = "EGRESS_TEST_ANSWERED"
"""Environment: distinct keys the receiver must have answered 2xx before the function raises."""
ANSWER_TIMEOUT = 30.0


def _distinct_keys(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as response:
        return int(json.loads(response.read())["distinct_keys"])


class RaisesOnceAnswered(ProcessFunction):
    """Emits ``payload`` unchanged; on the message whose ``id`` is ``$EGRESS_TEST_FAIL_AT`` it first
    waits until the receiver at ``$EGRESS_TEST_STATS_URL`` has answered ``$EGRESS_TEST_ANSWERED``
    distinct keys with a 2xx (messages of earlier, committed epochs), then raises ``RuntimeError``."""

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        fail_at = os.environ.get(FAIL_AT)
        if fail_at is not None and message.row["id"] == int(fail_at):
            url, answered = os.environ[STATS_URL], int(os.environ[ANSWERED])
            loop = asyncio.get_running_loop()
            deadline = loop.time() + ANSWER_TIMEOUT
            while await asyncio.to_thread(_distinct_keys, url) < answered:
                if loop.time() > deadline:
                    raise TimeoutError(f"the receiver did not answer {answered} keys within {ANSWER_TIMEOUT} s")
                await asyncio.sleep(0.01)  # polling for a positive signal, bounded by the deadline
            raise RuntimeError(f"planted failure on id {message.row['id']}")
        output.add_message("requests", {"payload": message.row["payload"]})
