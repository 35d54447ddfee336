"""What a NATS server routes, by kind: every message published on it (a core subscription to
``>``: the engine's KV publishes, JetStream API requests and direct gets, their replies, the
appends and member notices), counted by what it is, for the benchmarks' per-second and
per-message tallies (``cluster_idle.py``, ``cluster.py --tally``). The subscription receives every
message once more, so the server's own CPU and ``out_msgs`` are not comparable with a run without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections import Counter

import orjson


def message_kind(subject: str, data: bytes) -> str:
    """What a message the server routed is, for the tally: the subject with its variable tokens
    (worker ids, partitions, offsets, inboxes) elided, a direct get named by what it asks for."""
    if subject.startswith("_INBOX."):
        return "_INBOX (replies)"
    tokens = subject.split(".")
    if subject.startswith("$KV.") and len(tokens) > 3:
        return f"$KV publish {tokens[2]}"  # the key's kind: lease, member, checkpoint, log, ...
    if subject.startswith("$JS.API.DIRECT.GET."):
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            request = orjson.loads(data) if data else {}
            asked = "multi_last" if "multi_last" in request else "last_by_subj" if "last_by_subj" in request \
                else "next_by_subj" if "next_by_subj" in request else "seq" if "seq" in request else ",".join(request)
            about = request.get("last_by_subj") or request.get("next_by_subj") or (request.get("multi_last") or [""])[0]
            kind = about.split(".")[2] if about.count(".") > 2 else ""
            return f"direct get {asked} {kind}".rstrip()
        return "direct get"
    if subject.startswith("$JS.API."):
        return "$JS.API " + ".".join(token for token in tokens[2:4] if not re.search(r"[0-9]|KV_", token))
    return re.sub(r"\.[^.]*[0-9][^.]*", ".#", subject)


class Tally:
    """Every message the server routes (a core subscription to ``>`` of its own connection),
    counted by :func:`message_kind` between :meth:`start` and :meth:`stop`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.counts: Counter[str] = Counter()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the tally's subscription did not start")

    def stop(self) -> Counter[str]:
        assert self._loop is not None
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        return self.counts

    async def _run(self) -> None:
        import nats

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        client = await nats.connect(self.url)

        async def count(message: nats.aio.msg.Msg) -> None:
            self.counts[message_kind(message.subject, message.data)] += 1

        await client.subscribe(">", cb=count)
        await client.flush()
        self._ready.set()
        await self._stop.wait()
        await client.drain()
