"""Callers of ``throttle(1)`` in their own process, reporting each return to a receiver.

``python -m tests.e2e.throttler_callers --dynamic-spec F --service URL --receiver PORT --name N
--classes a,b --callers 16``: one prefetching client per class (throttler ``q``), its callers in a
loop; after every ``throttle(1)`` that returned, one line ``<class>\\n`` on one TCP connection to
``127.0.0.1:PORT``. Ends when the receiver closes that connection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from egress.clock import RealClock
from egress.throttler.factory import ThrottlerFactory
from egress.throttler.http_transport import HttpTransport
from egress.throttler.service import load_throttlers


async def run(args: argparse.Namespace) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", args.receiver)
    throttlers = load_throttlers(args.dynamic_spec)
    transport = HttpTransport(args.service)
    factories = [ThrottlerFactory(transport, RealClock(), throttlers, class_ids={"q": class_id},
                                  client_id=f"{args.name}-{class_id}") for class_id in args.classes.split(",")]

    async def caller(factory: ThrottlerFactory, class_id: str) -> None:
        handle = factory.get_throttler_or_throw("q")
        while True:
            await handle.throttle(1)
            writer.write(f"{class_id}\n".encode())

    callers = [asyncio.create_task(caller(factory, class_id))
               for factory, class_id in zip(factories, args.classes.split(","), strict=True)
               for _ in range(args.callers)]
    with contextlib.suppress(ConnectionError):
        await reader.read()  # the receiver closes the connection: the measurement is over
    for task in callers:
        task.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    for factory in factories:
        await factory.aclose()
    await transport.aclose()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dynamic-spec", required=True)
    parser.add_argument("--service", required=True)
    parser.add_argument("--receiver", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--classes", required=True)
    parser.add_argument("--callers", type=int, default=16)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
