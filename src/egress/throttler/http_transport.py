"""``RequestQuota`` over HTTP/JSON to ``egress throttler serve`` (aiohttp client).

Connection errors, 5xx answers and ``rpc_timeout`` expiry raise :class:`ControllerUnavailableError`
(the client retries them); ``400`` answers raise the controller's error with its upstream text.
A timeout closes the connection, which makes the service cancel and refund the request.

The answer ``{"amount", "lease", "waited"}`` gives the units granted, the seconds left of their
lease when the service replied and how long the service held the request. The reply travelled at
most the round trip less ``waited``, so the client's deadline ``arrival + lease − (round trip −
waited)`` is never later than the lease the controller counted, whatever the two processes' clocks
say.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from egress.clock import Clock, RealClock
from egress.throttler.controller import Grant
from egress.throttler.errors import ControllerUnavailableError
from egress.throttler.service import REQUEST_QUOTA_PATH
from egress.throttler.transport import with_timeout
from egress.throttler.wire import decode_answer, encode_call, grant_of, raise_refusal


class HttpTransport:
    """Talks to the throttler service at ``base_url`` (``http://host:port``); one pooled session."""

    def __init__(self, base_url: str, clock: Clock | None = None, *, max_connections: int = 256) -> None:
        self.url = base_url.rstrip("/") + REQUEST_QUOTA_PATH
        self.clock = clock or RealClock()
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections)
            self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def request_quota(self, throttler_id: str, amount: float, *, timestamp: float, quota_class_id: str | None,
                            client_id: str, rpc_timeout: float, hold: float = 0.0, request_id: str = "") -> Grant:
        body = encode_call(throttler_id, amount, timestamp=timestamp, quota_class_id=quota_class_id,
                           client_id=client_id, hold=hold, request_id=request_id)
        sent = self.clock.monotonic()
        answer = await with_timeout(self.clock, self._post(body), rpc_timeout,
                                    f'RequestQuota to throttler "{throttler_id}"')
        return grant_of(answer, amount, sent, self.clock)

    async def _post(self, body: bytes) -> dict[str, Any]:
        session = self._get_session()
        try:
            async with session.post(self.url, data=body, headers={"Content-Type": "application/json"}) as response:
                payload = await response.read()
                status = response.status
        except (aiohttp.ClientError, OSError) as error:
            raise ControllerUnavailableError(f"throttler service {self.url}: {error or type(error).__name__}") from None
        answer = decode_answer(payload)
        if status != 200:
            raise_refusal(answer, f"throttler service answered {status}", unavailable=status >= 500)
        return answer

    def withdraw(self, request_id: str) -> None:
        """Nothing to send: the closed connection of the cancelled call cancels (and refunds) it."""

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
