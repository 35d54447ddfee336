"""``RequestQuota`` over NATS request/reply: the cluster's transport (nats-py, core NATS).

The controller (:class:`NatsQuotaServer`) subscribes to one subject per pipeline, in queue group
``throttler``; a client (:class:`NatsTransport`) sends the request of :mod:`~egress.throttler.wire`
to it and waits for the reply on its inbox. No responder (no controller elected yet, or it died),
a lost connection, or no reply within ``rpc_timeout`` raise :class:`ControllerUnavailableError`:
the client retries under ``retrying_channel`` as over HTTP. The request carries ``rpc_timeout``:
the server cancels (and refunds) a request still waiting then, as the HTTP service does when the
client disconnects. NATS tells the server nothing when a client gives up earlier, so the request
also carries its ``request_id`` (the same for every attempt): a retry replaces the copy still
waiting, and a client whose caller is cancelled publishes a withdrawal (``{"withdraw": id}``) on
the subject, so no copy nobody waits for holds units (its grant would be lost). Grants get
:data:`REPLY_ALLOWANCE` seconds more for the reply's travel, and the client's deadline is computed
as over HTTP (:func:`~egress.throttler.wire.grant_of`), so it is never later than the lease the controller counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsClientError

from egress.clock import Clock, RealClock
from egress.nats_connections import NatsUnreachableError, close_connection, connect
from egress.throttler.controller import Grant, ThrottlerController
from egress.throttler.errors import ControllerUnavailableError
from egress.throttler.transport import with_timeout
from egress.throttler.wire import (
    BadRequestError,
    answer_call,
    decode_answer,
    decode_call,
    encode_call,
    encode_withdrawal,
    grant_of,
    raise_refusal,
    withdrawn_id,
)

log = logging.getLogger("egress.throttler.nats")

REPLY_ALLOWANCE = 0.05
"""Seconds added to every lease the NATS controller grants, for the reply's travel to its client."""

QUEUE_GROUP = "throttler"

WITHDRAWN_MEMORY = 60.0
"""Seconds the controller refuses a request id withdrawn before the request reached it (the
withdrawal overtook it): longer than any request stays on its way."""


def request_subject(bucket: str) -> str:
    """The subject the controller of the pipeline stored in NATS KV bucket ``bucket`` serves
    (``egress.<bucket>.throttler.request_quota``; a bucket name is plain: A-Z a-z 0-9 _ -)."""
    return f"egress.{bucket}.throttler.request_quota"


def announce_subject(subject: str) -> str:
    """Where a server says it began serving ``subject``: ``<subject>.serving``."""
    return subject + ".serving"


class NatsConnection:
    """One nats-py connection to ``servers`` (``nats://host:port`` each), opened on first use and
    reconnecting for ever; :meth:`get` raises :class:`ControllerUnavailableError` while the servers
    cannot be reached."""

    def __init__(self, servers: Sequence[str], *, name: str = "egress throttler", connect_timeout: float = 5.0) -> None:
        self.servers = list(servers)
        self.name = name
        self.connect_timeout = connect_timeout
        self._client: Client | None = None
        self._lock = asyncio.Lock()
        self._lost: asyncio.Future[None] | None = None  # resolved when the connection drops

    def lost(self) -> asyncio.Future[None]:
        """A future resolved the next time the connection drops (requests in flight get no reply)."""
        if self._lost is None or self._lost.done():
            self._lost = asyncio.get_running_loop().create_future()
        return self._lost

    def _on_disconnected(self) -> None:
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)

    async def get(self) -> Client:
        async with self._lock:
            if self._client is not None and not self._client.is_closed:
                return self._client
            client = Client()
            servers = ", ".join(self.servers)
            try:
                await connect(client, self.servers, self.connect_timeout, label=f"{servers} ({self.name})",
                              name=self.name, on_disconnected=self._on_disconnected)
            except NatsUnreachableError as error:
                raise ControllerUnavailableError(f"throttler over NATS {servers}: cannot connect ({error.cause})"
                                                 ) from None
            self._client = client
            return client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await close_connection(client, ", ".join(self.servers))


class NatsTransport:
    """A :class:`~egress.throttler.transport.QuotaTransport` to the controller serving ``subject``
    on ``connection``; ``clock`` measures ``rpc_timeout`` and the grant's deadline.

    A request sent to a controller that then dies gets no reply; rather than wait out its
    ``rpc_timeout``, it is given up (``ControllerUnavailableError``, so retried at once) when a
    server announces on :func:`announce_subject` that it began serving (the next controller), or
    when the connection drops; while the connection is down requests fail at once.
    """

    def __init__(self, connection: NatsConnection, subject: str, clock: Clock | None = None) -> None:
        self.connection = connection
        self.subject = subject
        self.clock = clock or RealClock()
        self._announced: asyncio.Future[None] | None = None  # resolved at the next announcement
        self._listening: Subscription | None = None
        self._withdrawing: set[asyncio.Task[None]] = set()

    async def request_quota(self, throttler_id: str, amount: float, *, timestamp: float, quota_class_id: str | None,
                            client_id: str, rpc_timeout: float, hold: float = 0.0, request_id: str = "") -> Grant:
        body = encode_call(throttler_id, amount, timestamp=timestamp, quota_class_id=quota_class_id,
                           client_id=client_id, hold=hold, rpc_timeout=rpc_timeout, request_id=request_id)
        sent = self.clock.monotonic()
        answer = await with_timeout(self.clock, self._request(body, rpc_timeout), rpc_timeout,
                                    f'RequestQuota to throttler "{throttler_id}" over NATS')
        return grant_of(answer, amount, sent, self.clock)

    async def _request(self, body: bytes, rpc_timeout: float) -> dict[str, object]:
        client = await self.connection.get()
        if not client.is_connected:  # reconnecting: no controller can be reached now
            raise ControllerUnavailableError(f"throttler controller on NATS subject {self.subject}: the NATS "
                                             "connection is down (reconnecting)")
        announced = await self._next_announcement(client)
        # nats-py's own timeout is a backstop: ``with_timeout`` on the clock gives up first.
        request = asyncio.ensure_future(client.request(self.subject, body, timeout=rpc_timeout + 1.0))
        racing: set[asyncio.Future[Any]] = {request, announced, self.connection.lost()}
        try:
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not request.done():
                request.cancel()
        if not request.done() or request.cancelled():
            raise ControllerUnavailableError(f"a new throttler controller serves NATS subject {self.subject}, or "
                                             "the NATS connection dropped; asking again")
        try:
            reply = request.result()
        except NatsClientError as error:  # no responders, timeout, connection closed or reconnecting
            raise ControllerUnavailableError(
                f"throttler controller on NATS subject {self.subject}: {error or type(error).__name__}") from None
        answer = decode_answer(reply.data)
        if "error" in answer:
            raise_refusal(answer, f"throttler controller on NATS subject {self.subject}")
        return answer

    async def _next_announcement(self, client: Client) -> asyncio.Future[None]:
        """A future resolved when a server next announces it began serving (subscribing once)."""
        if self._announced is None or self._announced.done():
            self._announced = asyncio.get_running_loop().create_future()
        if self._listening is None:
            async def on_announcement(_: Msg) -> None:
                if self._announced is not None and not self._announced.done():
                    self._announced.set_result(None)

            try:
                self._listening = await client.subscribe(announce_subject(self.subject), cb=on_announcement)
            except NatsClientError as error:
                raise ControllerUnavailableError(f"NATS subject {self.subject}: {error}") from None
        return self._announced

    def withdraw(self, request_id: str) -> None:
        """Publish ``{"withdraw": request_id}`` on the subject (best effort, no reply): the
        controller refunds the copy still waiting instead of holding it until its ``rpc_timeout``."""
        task = asyncio.get_running_loop().create_task(self._publish_withdrawal(request_id))
        self._withdrawing.add(task)
        task.add_done_callback(self._withdrawing.discard)

    async def _publish_withdrawal(self, request_id: str) -> None:
        try:
            client = await self.connection.get()
            await client.publish(self.subject, encode_withdrawal(request_id))
        except (ControllerUnavailableError, NatsClientError, OSError) as error:  # it times out there instead
            log.debug("NATS %s: the withdrawal of RequestQuota %s was not sent: %s", self.subject, request_id, error)

    async def aclose(self) -> None:
        """Stop listening for announcements (the connection is its owner's to close)."""
        await asyncio.gather(*self._withdrawing, return_exceptions=True)
        listening, self._listening = self._listening, None
        if listening is not None:
            with contextlib.suppress(NatsClientError, TimeoutError, OSError):
                await listening.unsubscribe()


class NatsQuotaServer:
    """Serves ``controller`` on ``subject`` over ``connection`` until :meth:`stop`.

    Each request waits in its own task, cancelled (so refunded) after the request's
    ``rpc_timeout``; :meth:`stop` closes the controller. ``entitled`` (default: always) says whether
    this server may still hand out quota: a grant decided when it no longer is (an elected
    controller whose lease may have lapsed) is answered ``unavailable`` instead, so two controllers
    never grant at the same time.
    """

    def __init__(self, controller: ThrottlerController, connection: NatsConnection, subject: str, *,
                 entitled: Callable[[], bool] | None = None) -> None:
        self.controller = controller
        self.connection = connection
        self.subject = subject
        self._entitled = entitled
        self._subscription: Subscription | None = None
        self._calls: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Subscribe, then announce it on :func:`announce_subject` (raises
        :class:`ControllerUnavailableError` when NATS cannot be reached)."""
        client = await self.connection.get()
        try:
            self._subscription = await client.subscribe(self.subject, queue=QUEUE_GROUP, cb=self._on_request)
            await client.flush(timeout=5)
            await client.publish(announce_subject(self.subject), b"")  # requests waiting elsewhere come here
        except (NatsClientError, TimeoutError, OSError) as error:
            raise ControllerUnavailableError(f"cannot serve the throttler on NATS subject {self.subject}: "
                                             f"{error or type(error).__name__}") from None

    async def _on_request(self, message: Msg) -> None:
        request_id = withdrawn_id(message.data)
        if request_id is not None:
            self.controller.withdraw(request_id, remember=WITHDRAWN_MEMORY)
            return
        task = asyncio.get_running_loop().create_task(self._answer(message))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _answer(self, message: Msg) -> None:
        controller = self.controller
        arrived = controller.clock.monotonic()
        try:
            call = decode_call(message.data)
        except BadRequestError as error:
            await self._reply(message, {"error": str(error), "code": "bad_request"})
            return
        asking = answer_call(controller, call, arrived)
        if call.rpc_timeout is None:
            _, answer = await asking
        else:
            try:
                _, answer = await with_timeout(controller.clock, asking, call.rpc_timeout, "RequestQuota")
            except ControllerUnavailableError:
                return  # the client gave up already; the request is refunded
        if answer.get("code") == "withdrawn":
            return  # the client asked again (that copy gets the answer) or gave it up
        if self._entitled is not None and not self._entitled() and "error" not in answer:
            answer = {"error": "the throttler controller lost its lease", "code": "unavailable"}
        await self._reply(message, answer)

    async def _reply(self, message: Msg, answer: dict[str, object]) -> None:
        if not message.reply:
            return
        try:
            await message.respond(orjson.dumps(answer))
        except (NatsClientError, OSError) as error:  # the client sees a timeout and retries
            log.debug("NATS %s: a RequestQuota reply was not sent: %s", self.subject, error)

    async def stop(self) -> None:
        """Stop taking requests and close the controller: the requests waiting are answered
        ``unavailable``, so their clients retry at once (with the next controller)."""
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            with contextlib.suppress(NatsClientError, TimeoutError, OSError):
                await subscription.unsubscribe()
        await self.controller.aclose()
        await asyncio.gather(*self._calls, return_exceptions=True)
