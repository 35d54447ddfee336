"""A local service for the real variant of the retryable example that fails transiently.

``POST /requests`` with ``{"request_id", "key", "request"}``: the first ``request_id % 3`` attempts
of each request get ``503``, later ones ``200`` with ``{"length": len(request)}``; a request whose
text contains ``poison`` always gets ``500`` (it ends in the ``dead_letter`` stream). ``GET /stats``
returns the attempts per request id.

    python -m examples.retryable_async_request.service --port 8702
"""

from __future__ import annotations

import argparse
from collections import Counter

from aiohttp import web

ATTEMPTS = web.AppKey("attempts", Counter[int])
"""The app key of the attempts counter (request id → attempts seen)."""


def create_app() -> web.Application:
    attempts: Counter[int] = Counter()

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        request_id = int(body["request_id"])
        attempts[request_id] += 1
        if "poison" in body["request"]:
            return web.json_response({"error": "cannot process"}, status=500)
        if attempts[request_id] <= request_id % 3:
            return web.json_response({"error": "try again"}, status=503)
        return web.json_response({"length": len(body["request"])})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({str(k): v for k, v in attempts.items()})

    app = web.Application()
    app[ATTEMPTS] = attempts
    app.router.add_post("/requests", handle)
    app.router.add_get("/stats", stats)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8702)
    args = parser.parse_args()
    web.run_app(create_app(), host="127.0.0.1", port=args.port, print=lambda text: print(text, flush=True))


if __name__ == "__main__":
    main()
