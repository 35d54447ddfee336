"""Local web sites for the URL downloader: each folder of ``sites/`` served by its own HTTP server
on its own loopback address (127.0.0.2, 127.0.0.3, ... in folder-name order), so each is a
distinct host. The files are real Debian documentation (libffi's HTML manual, base-passwd's
docs, package copyright files).

    python -m examples.url_downloader.serve --port 8701 [--log requests.jsonl] [--delay 0.02]
    python -m examples.url_downloader.serve --port 8701 --write-urls urls.jsonl   # the input, then exit

Every request is appended to ``--log`` as ``{"host", "path", "start", "end", "in_flight"}``, where
``in_flight`` counts the requests that host was serving at once (politeness means it stays 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO

from aiohttp import web

SITES = Path(__file__).resolve().parent / "sites"


def hosts(port: int) -> dict[str, Path]:
    """``"127.0.0.N:port"`` → the folder it serves."""
    folders = sorted(p for p in SITES.iterdir() if p.is_dir())
    return {f"127.0.0.{i + 2}:{port}": folder for i, folder in enumerate(folders)}


def urls(port: int) -> list[dict[str, str]]:
    """Every file of every site as an input row ``{host, url}``, in host then file order."""
    return [{"host": host, "url": f"http://{host}/{file.name}"}
            for host, folder in hosts(port).items() for file in sorted(folder.iterdir()) if file.is_file()]


def write_urls(path: Path, port: int) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in urls(port)))


def site(folder: Path, host: str, log: IO[str] | None, delay: float) -> web.Application:
    in_flight = 0

    async def serve(request: web.Request) -> web.StreamResponse:
        nonlocal in_flight
        in_flight += 1
        started = time.time()
        try:
            concurrent = in_flight
            await asyncio.sleep(delay)  # makes overlapping requests visible
            file = folder / request.match_info["name"]
            if not file.is_file():
                raise web.HTTPNotFound()
            return web.Response(body=file.read_bytes())
        finally:
            in_flight -= 1
            if log is not None:
                log.write(json.dumps({"host": host, "path": request.path, "start": started, "end": time.time(),
                                      "in_flight": concurrent}) + "\n")
                log.flush()

    app = web.Application()
    app.router.add_get("/{name}", serve)
    return app


async def start(port: int, log: IO[str] | None = None, delay: float = 0.02) -> Callable[[], Awaitable[None]]:
    """Start every site; returns a coroutine function that stops them."""
    runners = []
    for host, folder in hosts(port).items():
        runner = web.AppRunner(site(folder, host, log, delay), access_log=None)
        await runner.setup()
        address = host.rsplit(":", 1)[0]
        await web.TCPSite(runner, address, port).start()
        runners.append(runner)

    async def stop() -> None:
        for runner in runners:
            await runner.cleanup()

    return stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8701)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--delay", type=float, default=0.02, help="seconds each response takes")
    parser.add_argument("--write-urls", type=Path, help="write the input JSONL for these sites and exit")
    args = parser.parse_args()
    if args.write_urls:
        write_urls(args.write_urls, args.port)
        return

    async def serve() -> None:
        log = args.log.open("a", encoding="utf-8") if args.log else None
        stop = await start(args.port, log, args.delay)
        print(f"serving {', '.join(hosts(args.port))}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
