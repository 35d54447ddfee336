"""The dashboard pages in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

``egress run --http-port`` with a receiver that answers 503 until told otherwise and an audit
computation held by a throttler with limit 0: the page shows the sink broken with its error and
the audit partition's lag; once the receiver answers 200 and the DynamicSpec lifts the limit, the
sink shows OK and the lag 0. ``egress throttler serve`` with two classes busy: the page shows the
limit and each class's share against its weight. Every request the pages make goes to the server
they came from (no CDN). Screenshots at 1280 and 390 pixels wide go to the folder printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
import yaml
from aiohttp import web

from tests.e2e.conftest import REPO, terminate
from tests.waiting import eventually_sync, exited

pytestmark = pytest.mark.e2e
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extras")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
MESSAGES = 40
WIDTHS = {"wide": (1280, 800), "phone": (390, 844)}
UI_TIMEOUT = 30_000  # ms: the page polls once a second; the pipeline needs a few seconds on a loaded machine


class SwitchableReceiver:
    """An aiohttp endpoint on loopback, in its own thread, answering 503 until :meth:`heal`, then 200."""

    def __init__(self) -> None:
        self.healthy = False
        self.statuses: list[int] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    async def _answer(self, request: web.Request) -> web.Response:
        await request.read()
        status = 200 if self.healthy else 503
        self.statuses.append(status)
        return web.Response(status=status, text="ok" if self.healthy else "down for maintenance")

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        self._started.set()
        self._loop.run_forever()

    def start(self) -> None:
        self._thread.start()
        assert self._started.wait(10), "the receiver did not start"

    def heal(self) -> None:
        self.healthy = True

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):  # .ci/run installs it: in CI a missing browser is a failure, not a skip
            pytest.fail(f"no Chromium at {CHROMIUM}: .ci/run should have installed it (apt-get install chromium)")
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (.ci/run does)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    folder = tmp_path / "screenshots"
    folder.mkdir()
    print(f"\ndashboard screenshots: {folder}")
    return folder


class LoopbackOnly:
    """A browser context whose every request is recorded; any to another host than ``host:port`` is aborted."""

    def __init__(self, browser: Any, port: int) -> None:
        self.origin = f"127.0.0.1:{port}"
        self.requests: list[str] = []
        self.context = browser.new_context(viewport={"width": 1280, "height": 800})
        self.context.route("**/*", self._route)

    def _route(self, route: Any) -> None:
        url = route.request.url
        self.requests.append(url)
        if urlsplit(url).netloc == self.origin:
            route.continue_()
        else:
            route.abort()

    def assert_only_loopback(self) -> None:
        assert self.requests, "the page made no request"
        elsewhere = [url for url in self.requests if urlsplit(url).netloc != self.origin]
        assert not elsewhere, f"requests left for another host: {elsewhere}"


RECORD_LAGS = """
window.lagsShown = [];
new MutationObserver(() => {
  const cell = document.querySelector('[data-partition="audit/0"] .lag-messages');
  const last = window.lagsShown[window.lagsShown.length - 1];
  if (cell && cell.textContent !== last) window.lagsShown.push(cell.textContent);
}).observe(document, {childList: true, subtree: true, characterData: true});
"""
"""Every change of the audit partition's lag figure, in order, into ``window.lagsShown``."""


def shoot(page: Any, folder: Path, name: str) -> None:
    """Screenshots of ``page`` at both widths (full page), back at the wide one afterwards."""
    for label, (width, height) in WIDTHS.items():
        renders = page.evaluate("Number(document.body.dataset.renders)")
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_function(f"Number(document.body.dataset.renders) > {renders}")  # redrawn for the width
        page.screenshot(path=str(folder / f"{name}-{label}.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.load(answer)


def wait_until_serving(url: str, process: subprocess.Popen[Any], limit: float = 30.0) -> None:
    eventually_sync(lambda: [get_json(url)], what=f"{url} answering", timeout=limit, interval=0.1,
                    ignoring=(OSError,), unless=exited(process))


def write_pipeline(folder: Path, url: str) -> tuple[Path, Path]:
    """A source, ``deliver`` (→ sink ``http``) and ``audit`` (→ sink ``archive``, its input
    throttled by ``audit_rate``, limit 0: held until the DynamicSpec lifts it)."""
    data = folder / "events.jsonl"
    data.write_bytes(b"".join(orjson.dumps({"id": i, "payload": f"event {i}"}) + b"\n" for i in range(MESSAGES)))
    sink = {"sink_class_name": "async_http", "parameters": {"url": url, "payload_column": "payload"}}
    spec = {
        "pipeline": "dashboard_demo",
        "streams": {
            "events": {"schema": [{"name": "id", "type": "int64", "required": True},
                                  {"name": "payload", "type": "string"}], "group_by": ["id"]},
            "requests": {"schema": [{"name": "payload", "type": "string"}]},
            "requests_vip": {"schema": [{"name": "payload", "type": "string"}]},
        },
        "sources": {"events_jsonl": {"source_class_name": "jsonl", "output_stream_id": "events",
                                     "parameters": {"path": str(data)}}},
        "computations": {
            "deliver": {"processing_function": "tests.pipelines:Passthrough", "input_stream_ids": ["events"],
                        "output_stream_ids": ["requests"],
                        "sinks": {"http": {**sink, "input_stream_ids": ["requests"]}}},
            "audit": {"processing_function": "tests.pipelines:PassthroughToVip", "input_stream_ids": ["events"],
                      "output_stream_ids": ["requests_vip"],
                      "sinks": {"archive": {**sink, "input_stream_ids": ["requests_vip"]}}},
        },
    }
    spec_path = folder / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    dynamic_path = folder / "dynamic.yaml"
    write_dynamic(dynamic_path, limit=0)
    return spec_path, dynamic_path


def write_dynamic(path: Path, *, limit: float) -> None:
    retries = {"retry_initial_delay": "100ms", "retry_minimum_delay": "100ms", "retry_maximum_delay": "300ms",
               "max_attempt_count": 100, "request_timeout": "10m"}
    dynamic = {
        "throttlers": {"audit_rate": {"limit": limit, "period": "1s", "request_period": "200ms",
                                      "classes": {"audit": {"weight": 1}}}},
        "computations": {
            "deliver": {"sinks": {"http": {"parameters": retries}}},
            "audit": {"sinks": {"archive": {"parameters": retries}}, "input_rows_throttler_id": "audit_rate",
                      "input_rows_throttler_class_id": "audit"},
        },
    }
    temporary = path.with_suffix(".tmp")
    temporary.write_text(yaml.safe_dump(dynamic))
    temporary.replace(path)  # the run re-reads the file live: never half-written


def test_pipeline_page_shows_a_failing_sink_and_the_lag_until_both_recover(
        tmp_path: Path, browser: Any, screenshots: Path, unused_tcp_port: int) -> None:
    receiver = SwitchableReceiver()
    receiver.start()
    spec, dynamic = write_pipeline(tmp_path, f"http://127.0.0.1:{receiver.port}/events")
    process = subprocess.Popen(
        [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic), "--state-dir",
         str(tmp_path / "state"), "--quiet", "--http-port", str(unused_tcp_port)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    guard = LoopbackOnly(browser, unused_tcp_port)
    try:
        wait_until_serving(f"http://127.0.0.1:{unused_tcp_port}/status", process)
        page = guard.context.new_page()
        page.add_init_script(RECORD_LAGS)
        page.goto(f"http://127.0.0.1:{unused_tcp_port}/")
        expect = sync_api.expect
        sink = page.locator('[data-sink="deliver/http"]')
        expect(sink).to_have_attribute("data-state", "broken", timeout=UI_TIMEOUT)
        expect(sink.locator(".sink-error")).to_contain_text("Async HTTP POST failed", timeout=UI_TIMEOUT)
        expect(sink.locator(".sink-error")).to_contain_text("503")
        expect(page.locator('[data-node="sink:deliver/http"]')).to_have_attribute("data-state", "broken")
        lag = page.locator('[data-partition="audit/0"] .lag-messages')
        expect(lag).to_have_text(str(MESSAGES), timeout=UI_TIMEOUT)
        expect(page.locator('[data-throttler="audit_rate"] .throttler-limit')).to_have_text("0/s")
        expect(page.locator("#problems")).to_contain_text("/sinks/http/async_http_sink")
        source = page.locator('[data-source="events_jsonl"]')  # read at once: its records are partition lag now
        expect(source.locator(".unread-records")).to_have_text("0", timeout=UI_TIMEOUT)
        expect(source.locator(".state")).to_have_text("read to its end")
        expect(sink.locator(".stat.retries .stat-value")).not_to_have_text("0", timeout=UI_TIMEOUT)
        shoot(page, screenshots, "pipeline-failing")

        receiver.heal()
        write_dynamic(dynamic, limit=1000)
        expect(sink).to_have_attribute("data-state", "ok", timeout=UI_TIMEOUT)
        expect(lag).to_have_text("0", timeout=UI_TIMEOUT)
        expect(page.locator('[data-partition="audit/0"]')).to_have_attribute("data-state", "ok")
        for name in ("deliver/http", "audit/archive"):
            expect(page.locator(f'[data-sink="{name}"] .stat.delivered .stat-value')).to_have_text(
                str(MESSAGES), timeout=UI_TIMEOUT)
        expect(page.locator('[data-throttler="audit_rate"] .throttler-limit')).to_have_text("1000/s")
        expect(page.locator("#problems")).to_be_hidden()
        shown = page.evaluate("window.lagsShown")
        assert str(MESSAGES) in shown, shown
        after_peak = [int(lag) for lag in shown[shown.index(str(MESSAGES)):]]
        assert after_peak == sorted(after_peak, reverse=True), shown  # risen to 40, then only down
        assert after_peak[-1] == 0, shown
        shoot(page, screenshots, "pipeline-recovered")
        guard.assert_only_loopback()
    finally:
        guard.context.close()
        terminate(process)  # type: ignore[arg-type]  # bytes output
        receiver.stop()
    assert 503 in receiver.statuses
    assert 200 in receiver.statuses


PART_SECONDS = """([computation, part]) => Number(document.querySelector(
  `[data-epoch-parts="${computation}"] .part[data-part="${part}"]`)?.dataset.seconds || 0)"""
"""The seconds the page shows for one part of one computation's epochs (0 while not shown)."""


def test_pipeline_page_shows_each_computations_epoch_parts_beside_the_graph(
        tmp_path: Path, browser: Any, screenshots: Path, unused_tcp_port: int) -> None:
    receiver = SwitchableReceiver()
    receiver.start()
    receiver.heal()
    spec, dynamic = write_pipeline(tmp_path, f"http://127.0.0.1:{receiver.port}/events")
    write_dynamic(dynamic, limit=20)  # the audit computation's 40 rows wait about a second for quota
    process = subprocess.Popen(
        [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic), "--state-dir",
         str(tmp_path / "state"), "--quiet", "--http-port", str(unused_tcp_port)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    guard = LoopbackOnly(browser, unused_tcp_port)
    try:
        wait_until_serving(f"http://127.0.0.1:{unused_tcp_port}/status", process)
        page = guard.context.new_page()
        page.goto(f"http://127.0.0.1:{unused_tcp_port}/")
        expect = sync_api.expect
        expect(page.locator("#epoch-parts-section")).to_be_visible(timeout=UI_TIMEOUT)
        for computation in ("deliver", "audit"):
            expect(page.locator(f'[data-epoch-parts="{computation}"] .part')).to_have_count(5)
        # The throttled computation's epochs spent time in Input.Throttle, the other's none; both processed.
        page.wait_for_function(f"({PART_SECONDS})(['audit', 'Input.Throttle']) > 0.3", timeout=UI_TIMEOUT)
        page.wait_for_function(f"({PART_SECONDS})(['deliver', 'commit']) > 0", timeout=UI_TIMEOUT)
        assert page.evaluate(f"({PART_SECONDS})(['deliver', 'Input.Throttle'])") == 0
        expect(page.locator('[data-epoch-parts="audit"] rect[data-part="Input.Throttle"]')).to_have_count(1)
        graph = page.locator("#graph-section").bounding_box()
        parts = page.locator("#epoch-parts-section").bounding_box()
        assert graph is not None
        assert parts is not None
        assert parts["x"] >= graph["x"] + graph["width"] - 1, (graph, parts)  # beside it, on its right
        assert abs(parts["y"] - graph["y"]) < 2, (graph, parts)
        shoot(page, screenshots, "epoch-parts")
        guard.assert_only_loopback()
    finally:
        guard.context.close()
        terminate(process)  # type: ignore[arg-type]  # bytes output
        receiver.stop()


def post_quota(url: str, class_id: str, amount: float) -> None:
    body = orjson.dumps({"throttler_id": "api", "client_id": f"test-{class_id}", "amount": amount,
                         "timestamp": time.time(), "quota_class_id": class_id})
    request = urllib.request.Request(f"{url}/v1/request_quota", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()


def test_throttler_service_page_shows_the_limit_and_each_class_share_against_its_weight(
        tmp_path: Path, browser: Any, screenshots: Path) -> None:
    dynamic = tmp_path / "throttlers.yaml"
    dynamic.write_text(yaml.safe_dump({"throttlers": {"api": {
        "limit": 20, "period": "1s", "classes": {"vip": {"weight": 3}, "bulk": {"weight": 1}}}}}))
    process = subprocess.Popen(
        [sys.executable, "-m", "egress", "throttler", "serve", "--dynamic-spec", str(dynamic), "--port", "0",
         "--state-file", str(tmp_path / "throttler.state")], cwd=REPO, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()
    clients: list[threading.Thread] = []
    guard: LoopbackOnly | None = None
    try:
        assert process.stderr is not None
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", process.stderr.readline())
        assert found, "the throttler service did not start"
        port = int(found.group(1))
        url = f"http://127.0.0.1:{port}"

        def busy(class_id: str) -> None:
            while not stop.is_set():
                try:
                    post_quota(url, class_id, 2)
                except OSError:  # the service stops at the end of the test
                    return

        clients = [threading.Thread(target=busy, args=(c,), daemon=True) for c in ("vip", "vip", "bulk", "bulk")]
        for client in clients:
            client.start()
        guard = LoopbackOnly(browser, port)
        page = guard.context.new_page()
        page.goto(f"{url}/")
        card = page.locator('[data-throttler="api"]')
        expect = sync_api.expect
        expect(card.locator(".throttler-limit")).to_have_text("20/s", timeout=UI_TIMEOUT)
        expect(card.locator('[data-class="vip"] .weight')).to_have_text("75% (3)", timeout=UI_TIMEOUT)
        expect(card.locator('[data-class="bulk"] .weight')).to_have_text("25% (1)")
        expect(card.locator(".throttler-rate")).to_have_text(re.compile(r"^(1\d|2\d)(\.\d)?/s$"), timeout=UI_TIMEOUT)
        expect(card.locator('[data-class="vip"] .share')).to_have_text(re.compile(r"^\d+%$"))
        shares = {c: int(card.locator(f'[data-class="{c}"] .share').inner_text().rstrip("%")) for c in ("vip", "bulk")}
        assert shares["vip"] > shares["bulk"], shares
        expect(page.locator("#graph-section")).to_be_hidden()
        shoot(page, screenshots, "throttlers")
        guard.assert_only_loopback()
    finally:
        stop.set()
        if guard is not None:
            guard.context.close()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        for client in clients:
            client.join(5)
