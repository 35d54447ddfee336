"""Three ``egress run --engine nats://`` workers share one throttler through the HTTP sink's
``throttler_id``: the workers elect its controller; SIGKILL of the controller's worker mid-run
hands the controller to another within one lease TTL, nothing is lost, and the receiver's worst
window stays within ``limit·T + limit·period`` across the whole run."""

from __future__ import annotations

import hashlib
import itertools
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from egress.keys import encode_key, partition_of
from egress.throttler.envelope import worst_excess
from tests.conftest import payload_spec
from tests.e2e.conftest import REPO, Receiver
from tests.nats_server import NatsServer
from tests.ports import free_port
from tests.receiver_record import recorded, recorded_count
from tests.waiting import eventually_sync

pytestmark = pytest.mark.e2e

LIMIT, PERIOD, MESSAGES, WORKERS = 10.0, 1.0, 150, 3
TTL, HEARTBEAT = 2.0, 0.5
TRANSIT = 0.1
"""Seconds a request may take from the use of its unit to the receiver, which stamps it when it
arrives: three workers, NATS and the receiver share a loaded 2-core machine, so a request is
sometimes late by a scheduling hiccup and lands in the next window. The test allows
``LIMIT·TRANSIT`` requests beyond the envelope for it (as tests/integration/runtime/test_throttled_pipeline.py
does within one process, with 0.05 s)."""


def get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bytes(response.read())
    except OSError:
        return None


def status(port: int) -> dict[str, Any] | None:
    body = get(f"http://127.0.0.1:{port}/status")
    return None if body is None else dict(json.loads(body))


def controller_named(port: int) -> str | None:
    """The controller a worker's /status names (``None`` while it does not answer yet)."""
    return ((status(port) or {}).get("throttler") or {}).get("controller")


def serving(ports: dict[str, int], alive: set[str]) -> str | None:
    """The worker whose /status says it serves the controller and whose lease names it, if any."""
    for worker in alive:
        found = status(ports[worker])
        throttler = (found or {}).get("throttler") or {}
        if throttler.get("serving_here") and throttler.get("controller") == worker:
            return worker
    return None


def one_per_class(spec: dict[str, Any], classes: list[str]) -> None:
    """Replace the Spec's computation ``deliver`` by one per quota class, each delivering every
    message to ``/<class>`` in its class of the throttler."""
    deliver = spec["computations"].pop("deliver")
    for class_id in classes:
        stream = f"requests_{class_id}"
        spec["streams"][stream] = spec["streams"]["requests"]
        sink = {**deliver["sinks"]["http"], "input_stream_ids": [stream]}
        sink["parameters"] = {**sink["parameters"], "throttler_class_id": class_id,
                              "url": sink["parameters"]["url"].replace("/events", f"/{class_id}")}
        spec["computations"][class_id] = {**deliver, "output_stream_ids": [stream], "sinks": {"http": sink},
                                          "processing_function": f"tests.pipelines:PassthroughTo{class_id.title()}"}
    del spec["streams"]["requests"]


Edit = Callable[[dict[str, Any], dict[str, Any]], None]
"""Changes a test makes to the Spec and DynamicSpec documents of :func:`start_workers`."""


def start_workers(tmp_path: Path, receiver: Receiver, nats_url: str, messages: int,
                  processes: list[subprocess.Popen[bytes]], one_computation_per_class: list[str] | None = None,
                  edit: Edit | None = None, until_drained: bool = True, partitions: int = 3,
                  own_dynamic_specs: bool = False, **throttler: Any) -> dict[str, int]:
    """``WORKERS`` workers of a pipeline of this test's own, delivering ``messages`` requests
    through the throttler ``endpoint`` (limit ``LIMIT``, period ``PERIOD``, chunks of 2, and
    ``throttler``'s fields; with ``one_computation_per_class`` every message once per class, see
    :func:`one_per_class`; then ``edit``; ``--until-drained`` unless told not to: a followed
    source is drained whenever its file is read to its end; with ``own_dynamic_specs`` each
    worker reads a copy of the DynamicSpec, ``<worker>-dynamic.yaml``); returns each worker's
    ``--http-port``."""
    spec, dynamic = payload_spec(tmp_path, f"http://127.0.0.1:{receiver.port}/events",
                                 [f"message {i}" for i in range(messages)], partition_count=partitions,
                                 sink_parameters={"throttler_id": "endpoint"})
    document = yaml.safe_load(spec.read_text())
    document["pipeline"] = f"throttled_{tmp_path.name.replace('-', '_')}"[:60]
    if one_computation_per_class:
        one_per_class(document, one_computation_per_class)
    dynamic_document = yaml.safe_load(dynamic.read_text())
    if one_computation_per_class:
        deliver = dynamic_document["computations"].pop("deliver")
        dynamic_document["computations"] = {class_id: deliver for class_id in one_computation_per_class}
    dynamic_document["throttlers"] = {"endpoint": {
        "limit": LIMIT, "period": f"{PERIOD:g}s", "request_period": "250ms", "max_grant_amount": 2,
        "retrying_channel": {"retry_backoff_time": "100ms", "enable_exponential_retry_backoffs": False,
                             "retry_attempts": 10_000}, **throttler}}
    if edit is not None:
        edit(document, dynamic_document)
    spec.write_text(yaml.safe_dump(document))
    dynamic.write_text(yaml.safe_dump(dynamic_document))
    ports = {f"w{i}": free_port() for i in range(WORKERS)}
    for worker, port in ports.items():
        if own_dynamic_specs:
            dynamic = tmp_path / f"{worker}-dynamic.yaml"
            dynamic.write_text(yaml.safe_dump(dynamic_document))
        with (tmp_path / f"{worker}.log").open("wb") as log:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "egress", "run", str(spec), "--dynamic-spec", str(dynamic),
                 "--engine", nats_url, "--worker-id", worker, "--state-dir", str(tmp_path / worker),
                 "--lease-ttl", f"{TTL:g}", "--heartbeat-period", f"{HEARTBEAT:g}", "--http-port", str(port),
                 *(["--until-drained"] if until_drained else []), "--quiet"],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
    return ports


def received(receiver: Receiver) -> list[dict[str, Any]]:
    return recorded(receiver.record)


def wait_for_requests(receiver: Receiver, count: int, what: str, timeout: float = 60.0) -> None:
    eventually_sync(lambda: recorded_count(receiver.record) >= count, what=what, timeout=timeout,
                    interval=0.05)


@pytest.mark.timeout(180)
def test_the_controllers_worker_killed_mid_run_another_serves_within_one_ttl_and_the_envelope_holds(
        tmp_path: Path, receiver: Receiver, nats_server: str, egress_processes: list[subprocess.Popen[bytes]]) -> None:
    ports = start_workers(tmp_path, receiver, nats_server, MESSAGES, egress_processes)
    processes = dict(zip(ports, egress_processes, strict=True))
    alive = set(ports)

    first = eventually_sync(lambda: serving(ports, alive), what="a controller elected", interval=0.05)
    metrics = (get(f"http://127.0.0.1:{ports[first]}/metrics") or b"").decode()
    assert f'egress_throttler_controller{{worker_id="{first}"}} 1.0' in metrics
    others = alive - {first}
    for worker in others:  # every worker's /status names the same controller, once it is up
        assert eventually_sync(lambda w=worker: controller_named(ports[w]), what=f"{worker}'s /status",
                               interval=0.05) == first
    wait_for_requests(receiver, MESSAGES // 3, "a third of the messages delivered")

    processes[first].send_signal(signal.SIGKILL)
    processes[first].wait()
    killed = time.monotonic()
    alive.discard(first)
    successor = eventually_sync(lambda: serving(ports, alive), what="another controller", timeout=30, interval=0.05)
    took = time.monotonic() - killed
    # The lease lapses TTL after the last renewal (NATS rounds up to whole seconds and removes it
    # within a second), then the next try (every 0.5 s) takes it; /status is polled every 50 ms.
    assert took <= TTL + 1.0 + 0.5 + 0.5, f"{successor} took the controller {took:.2f} s after the kill"
    metrics = (get(f"http://127.0.0.1:{ports[successor]}/metrics") or b"").decode()
    assert f'egress_throttler_controller{{worker_id="{successor}"}} 1.0' in metrics
    wait_for_requests(receiver, len(received(receiver)) + 1, "deliveries resumed under the new controller", 10)
    resumed = time.monotonic() - killed

    for worker in alive:
        assert processes[worker].wait(timeout=120) == 0, (tmp_path / f"{worker}.log").read_text()
    records = received(receiver)
    delivered = {r["body_sha256"] for r in records if r["status"] == 200}
    assert len(delivered) == MESSAGES
    excess = worst_excess([(r["time"], 1.0) for r in records], LIMIT, LIMIT * PERIOD)
    print(f"\ncontroller {first} killed, {successor} served {took:.2f} s later, deliveries resumed after "
          f"{resumed:.2f} s; {len(records)} requests for {MESSAGES} messages; worst window {excess:+.2f} requests "
          "beyond limit·T + limit·period")
    assert excess <= LIMIT * TRANSIT, f"{excess:.2f} requests beyond limit·T + limit·period in the worst window"


def unacknowledged(port: int) -> int:
    """Messages the partitions a worker runs have committed for its sinks and not yet had acknowledged."""
    partitions = (status(port) or {}).get("partitions") or []
    return sum(sum((entry.get("unacknowledged") or {}).values()) for entry in partitions)


FALLBACK, OUTAGE = 3.0, 10.0
LEASE = 0.25 + 0.05
"""Seconds quota granted before the outage stays usable: ``prefetch_lease`` (the request period
here) and the reply allowance."""


@pytest.mark.timeout(240)
def test_with_fallback_rate_the_endpoint_keeps_receiving_at_about_it_while_nats_is_down_and_the_controller_returns(
        tmp_path: Path, receiver: Receiver, own_nats_server: NatsServer,
        egress_processes: list[subprocess.Popen[bytes]]) -> None:
    # 8 partitions and the source: 9 units, 3 per worker, so every worker runs partitions (with 3,
    # the source's worker can run none and have nothing to send).
    ports = start_workers(tmp_path, receiver, own_nats_server.url, 200, egress_processes, partitions=8,
                          fallback_rate=FALLBACK)
    alive = set(ports)
    eventually_sync(lambda: serving(ports, alive), what="a controller elected", interval=0.05)
    wait_for_requests(receiver, 30, "30 requests delivered under the controller")
    # Every worker must have work for the whole outage (its reads wait for NATS): at least its share
    # of it, fallback_rate / workers for OUTAGE seconds, committed and not yet acknowledged.
    share = FALLBACK / WORKERS * OUTAGE + 2
    for worker in ports:
        eventually_sync(lambda w=worker: unacknowledged(ports[w]) >= share,
                        what=f"{worker} holding {share:g} messages to send", timeout=30, interval=0.05)
    own_nats_server.kill()
    down = time.time()
    time.sleep(OUTAGE)
    own_nats_server.start()
    back = time.time()
    returned = eventually_sync(lambda: serving(ports, alive), what="a controller after NATS returned", timeout=30,
                               interval=0.05)
    resumed = time.time() - back
    for worker in alive:
        assert egress_processes[list(ports).index(worker)].wait(timeout=150) == 0, \
            (tmp_path / f"{worker}.log").read_text()
    records = received(receiver)
    assert len({r["body_sha256"] for r in records if r["status"] == 200}) == 200
    times = sorted(r["time"] for r in records)
    # While NATS is down: what was prefetched lasts one lease, then only each worker's share of
    # fallback_rate (FALLBACK / WORKERS, starting empty; a call may take its unit once a budget
    # holds one request period's worth, so each worker adds at most one call to a window).
    outage = [t for t in times if down + LEASE + TRANSIT < t < back]
    rate = len(outage) / (back - down - LEASE - TRANSIT)
    burst = WORKERS * max(1.0, FALLBACK / WORKERS * 0.25)
    excess = worst_excess([(t, 1.0) for t in outage], FALLBACK, burst)
    gaps = max(b - a for a, b in zip([down + LEASE + TRANSIT, *outage], [*outage, back], strict=True))
    whole = worst_excess([(t, 1.0) for t in times], LIMIT, LIMIT * PERIOD)
    print(f"\nNATS down {OUTAGE:g} s: {len(outage)} requests at {rate:.2f}/s (fallback_rate {FALLBACK:g}), longest "
          f"gap {gaps:.2f} s, worst window {excess:+.2f} beyond fallback_rate·T + {burst:g}; controller {returned} "
          f"{resumed:.2f} s after NATS returned; whole run {whole:+.2f} beyond limit·T + limit·period")
    assert rate <= FALLBACK
    # At least: each worker's budget starts empty when its clients find the controller away (within
    # one retry backoff of the lease's end) and hands out its first unit one unit's worth of its
    # share later (1 / (FALLBACK / WORKERS) s); the rest of the outage runs at the full rate.
    start = 1.0 / (FALLBACK / WORKERS) + 0.1 + 0.4  # + retry backoff + a scheduling allowance
    assert rate >= FALLBACK * (1 - start / (back - down - LEASE - TRANSIT)), f"{rate:.2f}/s while NATS was down"
    assert excess <= FALLBACK * TRANSIT
    assert gaps <= WORKERS / FALLBACK + 0.5  # it kept receiving: one worker's unit a second at least
    assert whole <= LIMIT * TRANSIT
    after = [t for t in times if t > back + resumed + 2 * LEASE]
    assert len(after) / (after[-1] - after[0]) > FALLBACK  # the controller's rate again, not the fallback


WEIGHTS = {"vip": 5.0, "regular": 3.0, "bulk": 1.0}
CHUNK = 1  # max_grant_amount (a whole number)


def class_metrics(port: int) -> dict[str, tuple[float, float]]:
    """The controller's ``(granted, pending requests)`` per quota class, from its /metrics."""
    text = (get(f"http://127.0.0.1:{port}/metrics") or b"").decode()
    found: dict[str, list[float]] = {class_id: [0.0, 0.0] for class_id in WEIGHTS}
    for line in text.splitlines():
        names = ("egress_throttler_class_granted_total", "egress_throttler_class_pending_requests")
        for index, name in enumerate(names):
            if line.startswith(name + "{"):
                labels, value = line[len(name) + 1:].rsplit("} ", 1)
                class_id = dict(part.split("=") for part in labels.split(",")).get("quota_class", "").strip('"')
                if class_id in found:
                    found[class_id][index] = float(value)
    return {class_id: (granted, pending) for class_id, (granted, pending) in found.items()}


@pytest.mark.timeout(180)
def test_weighted_classes_5_3_1_from_three_workers_share_the_limit_within_the_sfq_bound(
        tmp_path: Path, receiver: Receiver, nats_server: str,
        egress_processes: list[subprocess.Popen[bytes]]) -> None:
    limit = 18.0
    ports = start_workers(tmp_path, receiver, nats_server, 90, egress_processes,
                          one_computation_per_class=list(WEIGHTS), limit=limit, max_grant_amount=CHUNK,
                          classes={class_id: {"weight": weight} for class_id, weight in WEIGHTS.items()})
    controller = eventually_sync(lambda: serving(ports, set(ports)), what="a controller elected", interval=0.05)

    def all_backlogged() -> dict[str, tuple[float, float]] | None:
        found = class_metrics(ports[controller])
        return found if all(granted > 0 and pending > 0 for granted, pending in found.values()) else None

    first = eventually_sync(all_backlogged, what="every class granted and waiting at the controller", interval=0.05)
    time.sleep(4.0)
    second = all_backlogged()
    assert second is not None, "a class ran out of work within the measured interval: measure a shorter one"
    for worker, process in zip(ports, egress_processes, strict=True):
        assert process.wait(timeout=120) == 0, (tmp_path / f"{worker}.log").read_text()
    total = sum(WEIGHTS.values())
    share = {class_id: weight / total for class_id, weight in WEIGHTS.items()}
    granted = {class_id: second[class_id][0] - first[class_id][0] for class_id in WEIGHTS}
    print(f"\ngranted in 4 s at the controller ({controller}): " + ", ".join(
        f"{class_id} {units:g} ({units / sum(granted.values()):.3f}, ideal {share[class_id]:.3f})"
        for class_id, units in granted.items()))
    # SFQ over chunks of at most CHUNK units (Goyal, Vin, Cheng 1996): while classes i and j are both
    # backlogged, |granted_i / share_i − granted_j / share_j| <= CHUNK / share_i + CHUNK / share_j.
    for i in WEIGHTS:
        for j in WEIGHTS:
            gap = abs(granted[i] / share[i] - granted[j] / share[j])
            assert gap <= CHUNK / share[i] + CHUNK / share[j] + 1e-6, (i, j, granted)
    records = received(receiver)
    assert len({(r["path"], r["body_sha256"]) for r in records if r["status"] == 200}) == 3 * 90


LAGGING, LAGGING_MESSAGES, OTHER_MESSAGES, LAG_LIMIT = 0, 10, 60, 5.0
"""The partition whose messages are an hour old, the messages of it and of each other partition,
and the throttler's limit: the controller starts empty, so once both other batches wait for quota
the second of them waits at least OTHER_MESSAGES / LAG_LIMIT = 12 s more, long enough for the
lagging batch to be appended, read and joined while it still waits."""


def lagging_rows(now: float) -> tuple[list[str], list[str], dict[str, int]]:
    """JSONL lines ``(of the two other partitions, of LAGGING, partition of every request body's
    SHA-256)``: event times ``now``, and an hour before ``now`` for ``LAGGING``."""
    counts, others, late, partitions = [0, 0, 0], [], [], {}
    for i in itertools.count():
        partition = partition_of(encode_key([i]), 3)
        if counts[partition] < (LAGGING_MESSAGES if partition == LAGGING else OTHER_MESSAGES):
            counts[partition] += 1
            payload = f"p{partition} message {i}"
            line = json.dumps({"id": i, "payload": payload, "ts": now - 3600.0 if partition == LAGGING else now})
            (late if partition == LAGGING else others).append(line + "\n")
            partitions[hashlib.sha256(payload.encode()).hexdigest()] = partition
        if len(late) == LAGGING_MESSAGES and len(others) == 2 * OTHER_MESSAGES:
            return others, late, partitions


def throttled_input(data: Path, lines: list[str]) -> Edit:
    """The source follows ``data`` (written with ``lines``), its rows carry event times (column
    ``ts``), and every input batch takes one unit of throttler ``api`` per message
    (``input_rows_throttler_id``: each request carries the job's lag timestamp, the event time of
    the batch's first message); the sink is not throttled."""

    def edit(spec: dict[str, Any], dynamic: dict[str, Any]) -> None:
        spec["streams"]["events"]["schema"].append({"name": "ts", "type": "double"})
        source = spec["sources"]["events_jsonl"]["parameters"]
        source.update(timestamp_column="ts", follow=True, path=str(data))
        data.write_text("".join(lines))
        del spec["computations"]["deliver"]["sinks"]["http"]["parameters"]["throttler_id"]
        dynamic["throttlers"] = {"api": dynamic["throttlers"].pop("endpoint")}
        dynamic["computations"]["deliver"]["input_rows_throttler_id"] = "api"

    return edit


def sample(port: int, name: str) -> float | None:
    """The value of a metric with one series on a worker's /metrics (``None`` when absent)."""
    text = (get(f"http://127.0.0.1:{port}/metrics") or b"").decode()
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.timeout(180)
def test_the_most_lagging_partition_is_served_first_across_three_workers(
        tmp_path: Path, receiver: Receiver, nats_server: str,
        egress_processes: list[subprocess.Popen[bytes]]) -> None:
    others, late, partitions = lagging_rows(time.time())
    data = tmp_path / "followed.jsonl"
    ports = start_workers(tmp_path, receiver, nats_server, 0, egress_processes, edit=throttled_input(data, others),
                          until_drained=False, limit=LAG_LIMIT, max_grant_amount=1,
                          period=f"{OTHER_MESSAGES / LAG_LIMIT:g}s")
    controller = eventually_sync(lambda: serving(ports, set(ports)), what="a controller elected", interval=0.05)

    def pending() -> tuple[float, float] | None:
        """(requests, units) waiting for a grant at the controller (those granted but not yet
        released are not counted)."""
        found = [sample(ports[controller], f"egress_throttler_class_pending_{n}") for n in ("requests", "amount")]
        return None if found[0] is None or found[1] is None else (found[0], found[1])

    # The other partitions' batches (one request each, within the burst, served a unit at a time)
    # reach the controller first; once both wait, the second cannot be served before the first's
    # OTHER_MESSAGES units, so the lagging partition's batch joins while it still waits: in arrival
    # order it would be served last.
    eventually_sync(lambda: (sample(ports[controller], "egress_throttler_queue_size") or 0) >= 2,
                    what="both other partitions' batches waiting for quota", timeout=30, interval=0.05)
    with data.open("a") as file:
        file.write("".join(late))
    previous = pending() or (0.0, 0.0)

    def joined() -> list[float]:  # its units raise the units waiting at once
        nonlocal previous
        now = pending() or previous
        raised = now[1] >= previous[1] + LAGGING_MESSAGES - 1
        previous = now
        # the other requests still waiting for units when it joined, in a list: 0 of them is an answer too
        return [now[0] - 1] if raised else []

    [joined_with] = eventually_sync(joined, what="the lagging batch's units waiting for quota", timeout=30,
                                    interval=0.02)
    assert joined_with >= 1, f"the lagging batch's request joined {joined_with:g} other waiting request(s)"
    joined = time.time()
    eventually_sync(lambda: len(received(receiver)) >= LAGGING_MESSAGES + 2 * OTHER_MESSAGES,
                    what="every message delivered", timeout=60, interval=0.05)
    for process in egress_processes:
        process.send_signal(signal.SIGINT)
    for worker, process in zip(ports, egress_processes, strict=True):
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{worker} still running 30 s after SIGINT: {(tmp_path / f'{worker}.log').read_text()}")
        assert code == 0, (tmp_path / f"{worker}.log").read_text()
    records = received(receiver)
    times = sorted(r["time"] for r in records)
    rate = (len(times) - 1) / (times[-1] - times[0])
    done = {p: max(r["time"] for r in records if partitions[r["body_sha256"]] == p) for p in set(partitions.values())}
    lagging_done = done.pop(LAGGING)
    # Lag priority: the lagging request takes every unit from when it waits, so every other batch
    # still waiting for units then is delivered after it. Equal timestamps are served in arrival
    # order, so those still waiting were the last to be delivered.
    still_waiting = sorted(done.values())[len(done) - min(int(joined_with), len(done)):]
    print(f"\nthe lagging batch ({LAGGING_MESSAGES} units) joined {joined_with:g} other request(s) still waiting "
          f"for units; delivered {lagging_done - joined:.2f} s later (ideal {LAGGING_MESSAGES / LAG_LIMIT:g} s at the "
          "limit), the other partitions' batches "
          + ", ".join(f"{t - lagging_done:+.2f} s" for t in sorted(done.values())) + f" after it; {rate:.2f}/s "
          f"from the first delivery to the last (limit {LAG_LIMIT:g})")
    assert all(t > lagging_done for t in still_waiting), "a less lagging batch that waited with it was served first"
    # No request that nobody waits for holds units: the run goes at the limit (a copy of a given-up
    # request granted to nobody made it 2.5 × slower), and the lagging batch at about its ideal.
    assert rate >= 0.75 * LAG_LIMIT, f"{rate:.2f}/s at a limit of {LAG_LIMIT:g}"
    assert lagging_done - joined <= 2 * LAGGING_MESSAGES / LAG_LIMIT + 1.0


@pytest.mark.timeout(180)
def test_a_limit_changed_in_one_workers_dynamic_spec_reaches_the_controller_and_the_receiver_sees_it(
        tmp_path: Path, receiver: Receiver, nats_server: str,
        egress_processes: list[subprocess.Popen[bytes]]) -> None:
    slow, fast, messages = 5.0, 20.0, 160
    ports = start_workers(tmp_path, receiver, nats_server, messages, egress_processes, own_dynamic_specs=True,
                          limit=slow)
    controller = eventually_sync(lambda: serving(ports, set(ports)), what="a controller elected", interval=0.05)
    wait_for_requests(receiver, 20, "20 requests delivered at the first limit")
    changed = sorted(set(ports) - {controller})[0]  # a worker that is not the controller: its file only
    dynamic = tmp_path / f"{changed}-dynamic.yaml"
    document = yaml.safe_load(dynamic.read_text())
    document["throttlers"]["endpoint"]["limit"] = fast
    dynamic.write_text(yaml.safe_dump(document))
    edited = time.time()
    for worker, process in zip(ports, egress_processes, strict=True):
        assert process.wait(timeout=120) == 0, (tmp_path / f"{worker}.log").read_text()
    times = sorted(r["time"] for r in received(receiver))
    before = [t for t in times if t < edited]
    # The file is read within a second (dynamic_spec_period), published, and read by every worker
    # at its next try for (0.5 s) or renewal of (the heartbeat, 0.5 s) the controller lease.
    reached = edited + 1.0 + 0.5 + 0.5 + 0.5
    after = [t for t in times if t > reached]
    rate_before = (len(before) - 1) / (before[-1] - before[0])
    rate_after = (len(after) - 1) / (after[-1] - after[0])
    print(f"\nlimit {slow:g} → {fast:g} in {changed}'s DynamicSpec only (controller {controller}): "
          f"{rate_before:.2f}/s before, {rate_after:.2f}/s from {reached - edited:.1f} s after the edit on")
    assert len({r["body_sha256"] for r in received(receiver) if r["status"] == 200}) == messages
    assert rate_before <= slow * 1.1 + PERIOD * slow / (before[-1] - before[0])
    assert rate_after > 2 * slow, "the new limit did not reach the controller"
    assert worst_excess([(t, 1.0) for t in after], fast, fast * PERIOD) <= fast * TRANSIT
