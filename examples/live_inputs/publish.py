"""Publish orders into the JetStream stream ``ORDERS`` of ``nats_spec.yaml``, creating the stream
(subjects ``orders.>``) if it does not exist yet: what ``nats stream add`` and ``nats pub`` would do,
with only nats-py (the nats CLI is not installed with egress).

    .venv/bin/python -m examples.live_inputs.publish '{"order_id": 1, "amount": 9.5}' ...

Each argument is one message (its bytes as given) on ``--subject`` (default ``orders.eu``); the
last line printed is the stream's last sequence. The server at ``--url`` may still be starting: the
first connection is tried again every 0.2 s for ``--wait`` seconds (default 10).
"""

from __future__ import annotations

import argparse
import asyncio

import nats
from nats.errors import NoServersError
from nats.js.errors import NotFoundError

STREAM = "ORDERS"
SUBJECTS = ["orders.>"]


async def connect(url: str, wait: float) -> nats.NATS:
    """A connection to ``url``, tried every 0.2 s while nothing listens there, for about ``wait`` seconds."""

    async def quiet(error: Exception) -> None:  # a refused attempt: the last one is reported below
        del error

    try:
        return await nats.connect(url, connect_timeout=2, allow_reconnect=False, reconnect_time_wait=0.2,
                                  max_reconnect_attempts=max(1, round(wait / 0.2)), error_cb=quiet)
    except NoServersError:
        raise SystemExit(f"cannot connect to {url}: start nats-server with JetStream (-js) there") from None


async def publish(url: str, subject: str, messages: list[str], wait: float) -> int:
    """Create ``ORDERS`` unless it exists, publish ``messages`` to ``subject``; the stream's last sequence."""
    connection = await connect(url, wait)
    try:
        jetstream = connection.jetstream()
        try:
            await jetstream.stream_info(STREAM)
        except NotFoundError:
            await jetstream.add_stream(name=STREAM, subjects=SUBJECTS)
            print(f"created stream {STREAM} (subjects {', '.join(SUBJECTS)})")
        sequence = 0
        for message in messages:
            sequence = (await jetstream.publish(subject, message.encode())).seq
        return sequence
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("messages", nargs="+", help="one message each (a JSON object for nats_spec.yaml)")
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    parser.add_argument("--subject", default="orders.eu")
    parser.add_argument("--wait", type=float, default=10.0, help="seconds to wait for the server to listen")
    arguments = parser.parse_args()
    sequence = asyncio.run(publish(arguments.url, arguments.subject, arguments.messages, arguments.wait))
    print(f"published {len(arguments.messages)} message(s) to {arguments.subject}; stream {STREAM} last sequence "
          f"{sequence}")


if __name__ == "__main__":
    main()
