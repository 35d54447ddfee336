"""The URL downloader pipeline of YTsaurus Flow (upstream ``yt/yt/flow/examples/cpp/url_downloader``),
in egress.

``urls`` (``{host, url}``, keyed by host) → :class:`LimitedUrlDownloadFunction` (state + timers) →
``processed_urls`` (``{host, url, data, status, bytes, sha256}``). egress adds a second computation,
:class:`RecordProcessedUrl`, that writes every processed URL into the external state table
``processed_urls`` (keyed by URL, with an ``emitted`` counter), so a run can be inspected with
``egress state dump``.

Upstream logic, kept exactly: the host state is ``{host, urls: deque}``; a per-host downloader (in
memory, rebuilt after a restart) works one URL at a time per host with a politeness delay; a
message appends its URL to the state, registers host and URL, sets the host check timer and
enforces ``persist_limit``; a timer enforces the limit, registers the host (which seeds a new
worker from the state: the revival after a restart), emits every finished URL and removes it from
the state, and either clears the state and unregisters the host (nothing left) or sets the next
check. The next check is ``ts - ts % p + hash(host) % p + p`` (``p = check_host_period``), a
per-host phase that is always later than ``ts``. URLs dropped by ``persist_limit`` are still
downloaded while the process lives, but are lost if it restarts (upstream's warning).

``fetch: simulate`` is upstream's simulation (``data = "length: L, digits: D"``, then a pause of
500 + random(1000) ms); ``fetch: http`` downloads with GET through egress's libcurl client and
records status, bytes and sha256, retrying transient failures (no response, 5xx, 429).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator

from egress import InitContext, Message, OutputCollector, ProcessFunction, RuntimeContext, Timer
from egress.clock import Clock
from egress.httpclient import CurlClient, Request, backoff_seconds
from egress.httpclient.backoff import BackoffPolicy
from egress.runtime.state import ExternalStateClient, StateClient
from egress.spec.durations import Duration


class LimitedHostState(BaseModel):
    """Upstream ``TLimitedHostState``: the host and the URLs not yet emitted, oldest first."""

    host: str = ""
    urls: deque[str] = Field(default_factory=deque)


class UrlDownloadParameters(BaseModel):
    """Static parameters: ``fetch`` (``simulate`` as upstream, or ``http``); for ``http``:
    ``politeness_delay`` after each request to a host, ``timeout`` per attempt and
    ``max_attempts`` per URL (transient failures are retried with Flow's backoff)."""

    fetch: Literal["simulate", "http"] = "simulate"
    politeness_delay: Duration = 0.05
    timeout: Duration = 10.0
    max_attempts: int = Field(default=4, ge=1)


class DynamicUrlDownloadParameters(BaseModel):
    """Upstream ``TDynamicLimitedUrlDownloadParameters`` (DynamicSpec, applied live):
    ``check_host_period`` (default 5 s, must be more than 1 s) and ``persist_limit`` (default 1000)."""

    check_host_period: Duration = 5.0
    persist_limit: int = Field(default=1000, ge=1)

    @field_validator("check_host_period")
    @classmethod
    def _longer_than_a_second(cls, value: float) -> float:
        if value <= 1.0:
            raise ValueError(f"check_host_period must be more than 1 s, got {value} s")
        return value


@dataclass
class FetchResult:
    """What downloading one URL gave: upstream's ``data`` text, or the HTTP outcome."""

    data: str | None = None
    status: int | None = None
    bytes: int | None = None
    sha256: str | None = None


Fetch = Callable[[str], Awaitable[FetchResult]]


def host_hash(host: str) -> int:
    """A stable hash of the host name (blake2b; upstream uses its own string hash)."""
    return int.from_bytes(hashlib.blake2b(host.encode(), digest_size=8).digest(), "big")


def next_host_check(host: str, ts: float, period: float) -> float:
    """Upstream ``GetNextHostCheck``: ``ts - ts % p + hash(host) % p + p`` seconds, always > ``ts``.

    ``hash(host) % p`` is taken in whole seconds for a whole-second period (as upstream) and in
    milliseconds otherwise; the hash is an integer, never rounded through a float."""
    if float(period).is_integer():
        phase = float(host_hash(host) % int(period))
    else:
        milliseconds = round(period * 1000)
        phase = (host_hash(host) % milliseconds) / 1000
    return ts - ts % period + phase + period


@dataclass
class _Host:
    queue: deque[str] = field(default_factory=deque)
    processed: list[tuple[str, FetchResult]] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    worker: asyncio.Task[None] | None = None


class UrlDownloader:
    """Upstream ``TUrlDownloader``: one worker per host, each downloading one URL at a time then
    pausing (``pause()`` seconds on ``clock``). In memory only; rebuilt from state after a restart."""

    def __init__(self, fetch: Fetch, clock: Clock, pause: Callable[[], float]) -> None:
        self._fetch = fetch
        self._clock = clock
        self._pause = pause
        self.hosts: dict[str, _Host] = {}

    def register_host(self, host: str, urls: list[str]) -> bool:
        """Start a worker for ``host`` seeded with ``urls`` unless one runs; True when started."""
        if host in self.hosts:
            return False
        entry = _Host(deque(urls))
        entry.worker = asyncio.get_running_loop().create_task(self._work(entry), name=f"download {host}")
        if urls:
            entry.wake.set()
        self.hosts[host] = entry
        return True

    def register_url(self, host: str, url: str) -> None:
        entry = self.hosts[host]
        entry.queue.append(url)
        entry.wake.set()

    def extract_processed_urls(self, host: str) -> list[tuple[str, FetchResult]]:
        entry = self.hosts.get(host)
        if entry is None:
            return []
        processed, entry.processed = entry.processed, []
        return processed

    def unregister_host(self, host: str) -> None:
        entry = self.hosts.pop(host, None)
        if entry is not None and entry.worker is not None:
            entry.worker.cancel()

    async def close(self) -> None:
        workers = [e.worker for e in self.hosts.values() if e.worker is not None]
        self.hosts.clear()
        for worker in workers:
            worker.cancel()
        for worker in workers:
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    async def _work(self, entry: _Host) -> None:
        while True:
            while not entry.queue:
                entry.wake.clear()
                await entry.wake.wait()
            url = entry.queue.popleft()
            result = await self._fetch(url)
            # Not ``entry.processed.append((url, await ...))``: that binds the list before the await,
            # and a timer that extracts meanwhile would take the list the result then lands in.
            entry.processed.append((url, result))
            await self._clock.sleep(self._pause())


class LimitedUrlDownloadFunction(ProcessFunction):
    """Upstream ``TLimitedUrlDownloadFunction`` (see the module documentation)."""

    parameters_model = UrlDownloadParameters
    dynamic_parameters_model = DynamicUrlDownloadParameters

    def init(self, ctx: InitContext) -> None:
        self.host_state: StateClient[LimitedHostState] = ctx.state_client("host_state", LimitedHostState)
        self.parameters: UrlDownloadParameters = ctx.parameters
        self.client: CurlClient | None = None
        self.clock = ctx.clock
        self.random = random.Random()
        if self.parameters.fetch == "simulate":
            self.downloader = UrlDownloader(self.simulate, ctx.clock, lambda: 0.5 + self.random.random())
        else:
            self.downloader = UrlDownloader(self.download, ctx.clock, lambda: self.parameters.politeness_delay)

    async def close(self) -> None:
        await self.downloader.close()
        if self.client is not None:
            self.client.close()

    async def simulate(self, url: str) -> FetchResult:
        """Upstream's simulated download."""
        return FetchResult(data=f"length: {len(url)}, digits: {sum(c.isdigit() for c in url)}")

    async def download(self, url: str) -> FetchResult:
        """GET ``url``; retries no response, 5xx and 429 up to ``max_attempts`` with Flow's backoff."""
        if self.client is None:
            self.client = CurlClient(max_connections=16)
        policy = BackoffPolicy(initial_delay=0.1, minimum_delay=0.05, maximum_delay=2.0)
        response = None
        for attempt in range(1, self.parameters.max_attempts + 1):
            response = await self.client.send(Request(url, method="GET", capture_body=True,
                                                      timeout=self.parameters.timeout))
            if response.error is None and response.status < 500 and response.status != 429:
                break
            if attempt < self.parameters.max_attempts:
                await self.clock.sleep(backoff_seconds(policy, attempt - 1))
        assert response is not None
        body = response.body or b""
        return FetchResult(status=response.status, bytes=len(body), sha256=hashlib.sha256(body).hexdigest())

    def next_check(self, host: str, ctx: RuntimeContext) -> float:
        dynamic: DynamicUrlDownloadParameters = ctx.dynamic_parameters
        return next_host_check(host, ctx.now(), dynamic.check_host_period)

    def enforce_limit(self, state: LimitedHostState, ctx: RuntimeContext) -> None:
        dynamic: DynamicUrlDownloadParameters = ctx.dynamic_parameters
        while len(state.urls) > dynamic.persist_limit:
            state.urls.popleft()

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        host, url = message.row["host"], message.row["url"]
        state = self.host_state.get(message.key).value
        self.downloader.register_host(host, list(state.urls))
        state.host = host
        state.urls.append(url)
        self.downloader.register_url(host, url)
        output.add_timer(self.next_check(host, ctx))
        self.enforce_limit(state, ctx)

    async def process_timer(self, timer: Timer, output: OutputCollector, ctx: RuntimeContext) -> None:
        accessor = self.host_state.get(timer.key)
        state = accessor.value
        self.enforce_limit(state, ctx)
        self.downloader.register_host(state.host, list(state.urls))
        for url, result in self.downloader.extract_processed_urls(state.host):
            with contextlib.suppress(ValueError):
                state.urls.remove(url)
            output.add_message("processed_urls", {"host": state.host, "url": url, "data": result.data,
                                                  "status": result.status, "bytes": result.bytes,
                                                  "sha256": result.sha256})
        if not state.urls:
            self.downloader.unregister_host(state.host)
            accessor.clear()
        else:
            output.add_timer(self.next_check(state.host, ctx))


class RecordProcessedUrl(ProcessFunction):
    """egress's addition: each processed URL into the external state ``processed_urls`` (keyed by
    URL), counting how often it was emitted (exactly once per URL when nothing is lost or doubled)."""

    COLUMNS: ClassVar[dict[str, type]] = {"host": str, "data": str, "status": int, "bytes": int, "sha256": str,
                                          "emitted": int}

    def init(self, ctx: InitContext) -> None:
        self.table: ExternalStateClient = ctx.external_state_client("processed_urls", self.COLUMNS)

    async def process_message(self, message: Message, output: OutputCollector, ctx: RuntimeContext) -> None:
        row: dict[str, Any] = message.row
        record = self.table.get(message.key)
        for column in ("host", "data", "status", "bytes", "sha256"):
            record.set_column(column, row[column])
        record.set_column("emitted", (record.get_column("emitted") or 0) + 1)
