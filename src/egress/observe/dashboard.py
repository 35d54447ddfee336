"""The operator's live page: ``/`` (HTML, CSS and JS from the package) and ``/dashboard.json``.

The page polls ``/dashboard.json`` once a second. The document is computed here, on the server,
from what the process already has: the run's ``/status`` document (status tree, partitions with
owner, input lag and unacknowledged messages), its metrics registry (counters of sources,
computations, sinks and throttlers) and, from the runtime, the end offsets of each partition's
inputs. Rates are differences of counters between samples: one sample per request, at most one
per :data:`MIN_SAMPLE_INTERVAL` seconds, kept for :data:`HISTORY_SECONDS`; a rate spans the
samples of the last :data:`RATE_WINDOW` seconds. History exists only while someone polls.

Document shape (every rate in units per second, ``None`` until two samples exist)::

    {"title", "kind": "pipeline" | "throttlers", "time" (Unix seconds), "bucket_seconds",
     "graph": {"nodes": [{"id", "kind": "source"|"computation"|"sink", "label", "class"}],
               "edges": [{"from", "to", "stream", "rate"}]},
     "sources": [{"source_id", "unread_records" (null: unknown), "finished", "owner"}],
     "partitions": [{"computation", "partition", "owner", "input_lag" (messages), "input_lag_seconds",
                     "input_lag_seconds_at_least", "rate_in", "rate_out", "unacknowledged", "blocked"}],
     "sinks": [{"computation", "sink_id", "sink_class", "broken", "error", "rate", "delivered",
                "responses": {"2xx": n, ...}, "attempt_failures", "retries", "dead_letters",
                "chart": {"2xx": [n per bucket, oldest first], ..., "failed": [...]}}],
     "epoch_parts": [{"computation", "window_seconds", "total_seconds",
                      "parts": [{"part": "read"|"Input.Throttle"|"process"|"commit"|"deliver", "seconds", "share"}]}],
     # the seconds the computation's partition jobs spent in each part of their epochs over the
     # last HISTORY_SECONDS (window_seconds); since the run's start (window_seconds None) while
     # the page has been polled for less than that
     "throttlers": [{"throttler_id", "limit", "rate", "queue_size", "wait_seconds",
                     "classes": [{"class_id", "weight", "weight_share", "rate", "share", "pending_requests"}]}],
     # weight_share: the class's weight over the weights of the classes granted or waiting now
     # (backlogged classes share the rate in proportion to weight); None for an idle class
     "status": {path: error}, "worker", "members", "stopping", "dynamic_spec"}

Input lag in seconds is the age of the oldest unprocessed input message as the samples saw it
appended: the time of the first sample whose end offset was past the partition's position
(``input_lag_seconds_at_least`` when that message is older than the oldest sample kept).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from egress.clock import Clock
from egress.http_expect import expect_handler

SOURCE_FIELDS = ("unread_records", "finished", "owner")
"""What the page shows of each source, as ``/status`` → ``sources`` has it."""
MIN_SAMPLE_INTERVAL = 0.5
HISTORY_SECONDS = 300.0
RATE_WINDOW = 5.0
BUCKET_SECONDS = 10.0
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx")
STATIC_FILES = {"/": ("index.html", "text/html"), "/dashboard.js": ("dashboard.js", "application/javascript"),
                "/dashboard.css": ("dashboard.css", "text/css")}

StatusProvider = Callable[[], Awaitable[dict[str, Any]]]
EndsProvider = Callable[[], Awaitable[dict[tuple[str, int], int]]]
"""End offsets by ``(stream, partition)`` of the streams computations read."""
LimitsProvider = Callable[[], Mapping[str, float | None]]
GraphProvider = Callable[[], dict[str, Any]]

_SINK_COUNTER = re.compile(r"^egress_sink_(?P<name>[a-z_]+)_total$")
_SINK_NAMES = {"requests": "requests", "responses": "responses", "attempt_failures": "attempt_failures",
               "retries": "retries", "dead_letters": "dead_letters", "records_delivered": "delivered"}
Key = tuple[str, ...]


@dataclass
class Sample:
    """Counter values at ``time`` (monotonic seconds), by key (see :func:`read_counters`)."""

    time: float
    values: dict[Key, float] = field(default_factory=dict)

    @functools.cached_property
    def sink_scopes(self) -> frozenset[tuple[str, str]]:
        """The ``(computation or "", sink_id)`` pairs the sink counters of this sample carry."""
        return frozenset((key[1], key[2]) for key in self.values if key[0] == "sink")


ENDPOINT_STATES = ("closed", "half_open", "open", "paused")
"""Webhook endpoint states, from the best to the worst (``egress.connectors.sinks.webhook_breaker``)."""


def endpoint_summary(partitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The webhook endpoints of ``/status`` → ``partitions[].endpoints``, one row per (computation,
    sink, endpoint) with its partitions summed: the worst ``state`` (paused > open > half-open >
    closed), ``backlog`` and ``delivered`` totals and how many ``partitions`` report it; sorted."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for partition in partitions:
        for sink_id, endpoints in (partition.get("endpoints") or {}).items():
            for endpoint in endpoints:
                key = (str(partition["computation"]), str(sink_id), str(endpoint["endpoint"]))
                row = rows.setdefault(key, {"computation": key[0], "sink_id": key[1], "endpoint": key[2],
                                            "state": "closed", "backlog": 0, "delivered": 0, "partitions": 0})
                if ENDPOINT_STATES.index(endpoint["state"]) > ENDPOINT_STATES.index(row["state"]):
                    row["state"] = endpoint["state"]
                row["backlog"] += endpoint["backlog"]
                row["delivered"] += endpoint["delivered"]
                row["partitions"] += 1
    return [rows[key] for key in sorted(rows)]


def _computation_label(labels: Mapping[str, str]) -> str:
    """The computation a sink sample belongs to; ``""`` when its metric has no such label."""
    return labels.get("computation") or labels.get("computation_id") or ""


def status_class(code: str) -> str:
    """``"503"`` → ``"5xx"``; anything else that is not a 3-digit code → ``"other"``."""
    return f"{code[0]}xx" if len(code) == 3 and code.isdigit() else "other"


def read_counters(registry: CollectorRegistry) -> dict[Key, float]:
    """The sensors the page shows, flattened: ``("source", id)``, ``("computation", id)``,
    ``("sink", computation or "", sink_id, name[, status class])``, ``("throttler", id, name)``,
    ``("class", throttler_id, class_id, name)`` and ``("client", throttler_id)`` (units consumed here).

    Labels beyond the ones read are summed over, so a sensor that gains a label keeps its place.
    """
    values: dict[Key, float] = {}

    def add(key: Key, value: float) -> None:
        values[key] = values.get(key, 0.0) + value

    for family in registry.collect():
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            sink = _SINK_COUNTER.match(name)
            if sink is not None and "sink_id" in labels and sink["name"] in _SINK_NAMES:
                key: Key = ("sink", _computation_label(labels), labels["sink_id"], _SINK_NAMES[sink["name"]])
                add((*key, status_class(labels["status_code"])) if "status_code" in labels else key, value)
            elif name == "egress_source_rows_total":
                add(("source", labels["source_id"]), value)
            elif name == "egress_computation_input_messages_total":
                add(("computation", labels["computation_id"]), value)
            elif name == "egress_epoch_part_seconds_total":
                add(("part", labels["computation_id"], labels["part"]), value)
            elif name == "egress_throttler_value_total":
                add(("throttler", labels["throttler_id"], "granted"), value)
            elif name in ("egress_throttler_queue_size", "egress_throttler_wait_time_seconds"):
                add(("throttler", labels["throttler_id"], name.removeprefix("egress_throttler_")), value)
            elif name in ("egress_throttler_class_granted_total", "egress_throttler_class_weight",
                          "egress_throttler_class_pending_requests"):
                short = name.removeprefix("egress_throttler_class_").removesuffix("_total")
                add(("class", labels["throttler_id"], labels["quota_class"], short), value)
            elif name == "egress_throttler_client_consumed_total":
                add(("client", labels["throttler_id"]), value)
    return values


class History:
    """Samples of the last :data:`HISTORY_SECONDS`, and the rates and buckets computed from them."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.samples: deque[Sample] = deque()

    def take(self, values: Callable[[], dict[Key, float]]) -> Sample:
        """The newest sample: a new one from ``values()`` unless the last is younger than
        :data:`MIN_SAMPLE_INTERVAL` (several pages polling share samples)."""
        now = self.clock.monotonic()
        if self.samples and now - self.samples[-1].time < MIN_SAMPLE_INTERVAL:
            return self.samples[-1]
        self.samples.append(Sample(now, values()))
        while self.samples and now - self.samples[0].time > HISTORY_SECONDS + BUCKET_SECONDS:
            self.samples.popleft()
        return self.samples[-1]

    def rate(self, key: Key) -> float | None:
        """Units per second of counter ``key`` over the last :data:`RATE_WINDOW` (the two samples
        farthest apart in it); ``None`` with fewer than two samples."""
        if len(self.samples) < 2:
            return None
        newest = self.samples[-1]
        oldest = next((s for s in self.samples if newest.time - s.time <= RATE_WINDOW and s is not newest),
                      self.samples[-2])
        elapsed = newest.time - oldest.time
        if elapsed <= 0:
            return None
        return max(0.0, newest.values.get(key, 0.0) - oldest.values.get(key, 0.0)) / elapsed

    def buckets(self, key: Key) -> list[float]:
        """Increments of counter ``key`` per :data:`BUCKET_SECONDS` bucket over the last
        :data:`HISTORY_SECONDS`, oldest first; buckets are aligned to multiples of the bucket size."""
        count = int(HISTORY_SECONDS // BUCKET_SECONDS)
        totals = [0.0] * count
        if not self.samples:
            return totals
        last = math.floor(self.samples[-1].time / BUCKET_SECONDS)
        previous: Sample | None = None
        for sample in self.samples:
            if previous is not None:
                index = count - 1 - (last - math.floor(sample.time / BUCKET_SECONDS))
                if 0 <= index < count:
                    totals[index] += max(0.0, sample.values.get(key, 0.0) - previous.values.get(key, 0.0))
            previous = sample
        return totals

    def increase(self, key: Key) -> tuple[float, float | None]:
        """How much counter ``key`` grew over the last :data:`HISTORY_SECONDS`, and over how many
        seconds: from the oldest sample in that window to the newest once the history is older than
        the window; before (the page has not been polled that long), its whole value, the growth
        since the counter's start (``None`` seconds)."""
        if not self.samples:
            return 0.0, None
        newest = self.samples[-1]
        if newest.time - self.samples[0].time <= HISTORY_SECONDS:
            return newest.values.get(key, 0.0), None
        oldest = next(s for s in self.samples if newest.time - s.time <= HISTORY_SECONDS)
        return max(0.0, newest.values.get(key, 0.0) - oldest.values.get(key, 0.0)), newest.time - oldest.time

    def appended_since(self, key: Key, position: float) -> tuple[float, bool] | None:
        """Seconds since the first sample in which counter ``key`` (an end offset) passed
        ``position``, and whether that is only a lower bound (already past in the oldest sample);
        ``None`` when no sample has it past ``position``."""
        if not self.samples:
            return None
        now = self.samples[-1].time
        for index, sample in enumerate(self.samples):
            if sample.values.get(key, 0.0) > position:
                return now - sample.time, index == 0
        return None


class Dashboard:
    """The page and its JSON for one process: a pipeline run or a throttler service.

    ``status()`` is the runtime's ``/status`` document (``None``: no pipeline here, e.g. the
    throttler service); ``graph()`` the Spec's graph as :func:`graph_document` returns it;
    ``ends()`` the end offset of each ``(stream, partition)`` computations read (a partition's
    input end is the sum over its computation's input streams);
    ``limits()`` each throttler's limit in units per second (``None``: unlimited).
    """

    def __init__(self, registry: CollectorRegistry, clock: Clock, *, title: str,
                 status: StatusProvider | None = None, graph: GraphProvider | None = None,
                 ends: EndsProvider | None = None, limits: LimitsProvider | None = None) -> None:
        self.registry = registry
        self.clock = clock
        self.title = title
        self._status, self._graph, self._ends, self._limits = status, graph, ends, limits
        self.history = History(clock)

    async def document(self) -> dict[str, Any]:
        """The JSON of ``/dashboard.json`` (shape in the module docstring)."""
        status = await self._status() if self._status is not None else {}
        ends = await self._ends() if self._ends is not None else {}
        graph = self._graph() if self._graph is not None else {"nodes": [], "edges": []}
        inputs = {node["label"]: node["inputs"] for node in graph["nodes"] if node["kind"] == "computation"}

        def values() -> dict[Key, float]:
            found = read_counters(self.registry)
            for (stream, _), offset in ends.items():
                found["stream", stream] = found.get(("stream", stream), 0.0) + offset
            for entry in status.get("partitions", []):
                computation, partition, lag = entry["computation"], entry["partition"], entry.get("input_lag")
                streams = inputs.get(computation, [])
                if not streams or any((stream, partition) not in ends for stream in streams):
                    continue
                input_end = float(sum(ends[stream, partition] for stream in streams))
                found["end", computation, str(partition)] = input_end
                if lag is not None:
                    found["processed", computation, str(partition)] = input_end - lag
            return found

        sample = self.history.take(values)
        return {
            "title": self.title,
            "kind": "pipeline" if self._status is not None else "throttlers",
            "time": self.clock.now(),
            "bucket_seconds": BUCKET_SECONDS,
            "graph": self._graph_with_rates(graph, sample),
            "sources": [{"source_id": source_id, **{key: source.get(key) for key in SOURCE_FIELDS}}
                        for source_id, source in status.get("sources", {}).items()],
            "partitions": [self._partition(entry, sample) for entry in status.get("partitions", [])],
            "sinks": self._sinks(graph, status.get("status", {}), sample),
            "endpoints": endpoint_summary(status.get("partitions", [])),
            "epoch_parts": self._epoch_parts(graph),
            "throttlers": self._throttlers(sample),
            "status": status.get("status", {}),
            "worker": status.get("worker"),
            "members": status.get("members", []),
            "stopping": status.get("stopping", False),
            "dynamic_spec": status.get("dynamic_spec"),
        }

    def _graph_with_rates(self, graph: dict[str, Any], sample: Sample) -> dict[str, Any]:
        edges = []
        for edge in graph["edges"]:
            counter = tuple(edge["counter"])
            if counter[0] == "sink":
                counter = _sink_key(sample, counter[1], counter[2], "delivered")
            edges.append({key: value for key, value in edge.items() if key != "counter"}
                         | {"rate": self.history.rate(counter)})
        return {"nodes": graph["nodes"], "edges": edges}

    def _partition(self, entry: dict[str, Any], sample: Sample) -> dict[str, Any]:
        computation, partition = entry["computation"], entry["partition"]
        end: Key = ("end", computation, str(partition))
        lag = entry.get("input_lag")
        lag_seconds: float | None = entry.get("input_lag_seconds")
        at_least = False
        if lag_seconds is None and lag is not None and end in sample.values:
            since = self.history.appended_since(end, sample.values[end] - lag) if lag > 0 else (0.0, False)
            lag_seconds, at_least = since if since is not None else (None, False)
        unacknowledged = entry.get("unacknowledged")
        return {"computation": computation, "partition": partition, "owner": entry.get("owner"),
                "input_lag": lag, "input_lag_seconds": lag_seconds, "input_lag_seconds_at_least": at_least,
                "rate_in": self.history.rate(end) if end in sample.values else None,
                "rate_out": self.history.rate(("processed", computation, str(partition)))
                if ("processed", computation, str(partition)) in sample.values else None,
                "unacknowledged": None if unacknowledged is None else sum(unacknowledged.values()),
                "blocked": entry.get("blocked")}

    def _sinks(self, graph: dict[str, Any], status: dict[str, str], sample: Sample) -> list[dict[str, Any]]:
        sinks = []
        newest = sample.values
        for node in graph["nodes"]:
            if node["kind"] != "sink":
                continue
            computation, sink_id = node["computation"], node["sink_id"]

            def key(*name: str, computation: str = computation, sink_id: str = sink_id) -> Key:
                return _sink_key(sample, computation, sink_id, *name)

            error = sink_error(status, computation, sink_id)
            sinks.append({
                "computation": computation, "sink_id": sink_id, "sink_class": node["class"],
                "broken": error is not None, "error": error,
                "rate": self.history.rate(key("delivered")), "delivered": newest.get(key("delivered"), 0.0),
                "responses": {c: newest[key("responses", c)] for c in (*STATUS_CLASSES, "other")
                              if key("responses", c) in newest},
                "attempt_failures": newest.get(key("attempt_failures"), 0.0),
                "retries": newest.get(key("retries"), 0.0), "dead_letters": newest.get(key("dead_letters"), 0.0),
                "chart": {**{c: self.history.buckets(key("responses", c)) for c in STATUS_CLASSES},
                          "failed": self.history.buckets(key("attempt_failures"))},
            })
        return sinks

    def _epoch_parts(self, graph: dict[str, Any]) -> list[dict[str, Any]]:
        """Per computation of the graph, the seconds of each epoch part over the history
        (``egress_epoch_part_seconds_total``; ``egress.observe.epoch_parts``)."""
        from egress.observe.epoch_parts import PARTS

        found = []
        for node in graph["nodes"]:
            if node["kind"] != "computation":
                continue
            computation = node["label"]
            grown = {part: self.history.increase(("part", computation, part)) for part in PARTS}
            total = sum(seconds for seconds, _ in grown.values())
            windows = [window for _, window in grown.values() if window is not None]
            found.append({"computation": computation, "total_seconds": total,
                          "window_seconds": max(windows) if windows else None,
                          "parts": [{"part": part, "seconds": seconds, "share": seconds / total if total else None}
                                    for part, (seconds, _) in grown.items()]})
        return found

    def _throttlers(self, sample: Sample) -> list[dict[str, Any]]:
        limits = dict(self._limits()) if self._limits is not None else {}
        ids = sorted(set(limits) | {k[1] for k in sample.values if k[0] in ("throttler", "client")})
        throttlers = []
        for throttler_id in ids:
            here = ("throttler", throttler_id, "granted") in sample.values
            classes = sorted({k[2] for k in sample.values if k[0] == "class" and k[1] == throttler_id})
            rates = {c: self.history.rate(("class", throttler_id, c, "granted")) or 0.0 for c in classes}
            weights = {c: sample.values.get(("class", throttler_id, c, "weight"), 0.0) for c in classes}
            pending = {c: sample.values.get(("class", throttler_id, c, "pending_requests"), 0.0) for c in classes}
            active = [c for c in classes if rates[c] or pending[c]] or classes
            total_rate, total_weight = sum(rates.values()), sum(weights[c] for c in active)
            throttlers.append({
                "throttler_id": throttler_id, "limit": limits.get(throttler_id), "controller_here": here,
                "rate": self.history.rate(("throttler", throttler_id, "granted") if here else ("client", throttler_id)),
                "queue_size": sample.values.get(("throttler", throttler_id, "queue_size")) if here else None,
                "wait_seconds": sample.values.get(("throttler", throttler_id, "wait_time_seconds")) if here else None,
                "classes": [{"class_id": c, "weight": weights[c],
                             "weight_share": weights[c] / total_weight if total_weight and c in active else None,
                             "rate": rates[c], "share": rates[c] / total_rate if total_rate else None,
                             "pending_requests": pending[c]} for c in classes],
            })
        return throttlers

    def add_routes(self, app: web.Application) -> None:
        """Serve the page at ``/`` (and its script and style) and the document at ``/dashboard.json``
        (with :func:`egress.http_expect.expect_handler`: no 500 for a non-UTF-8 ``Expect``)."""

        async def get_document(request: web.Request) -> web.Response:
            return web.json_response(await self.document(), headers={"Cache-Control": "no-store"})

        for route, (name, content_type) in STATIC_FILES.items():
            app.router.add_get(route, _static_handler(name, content_type), expect_handler=expect_handler)
        app.router.add_get("/dashboard.json", get_document, expect_handler=expect_handler)


def _static_handler(name: str, content_type: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A handler answering the package file ``egress/observe/static/<name>`` (read once)."""
    body = resources.files("egress.observe").joinpath("static", name).read_bytes()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type=content_type, charset="utf-8")

    return handler


def _sink_key(sample: Sample, computation: str, sink_id: str, *name: str) -> Key:
    """The key of a sink counter: scoped by ``computation`` when the sensors carry it, else by
    ``sink_id`` alone (one series for every computation's sink of that name)."""
    if (computation, sink_id) in sample.sink_scopes:
        return ("sink", computation, sink_id, *name)
    return ("sink", "", sink_id, *name)


def sink_error(status: Mapping[str, str], computation: str, sink_id: str) -> str | None:
    """The status-tree error of sink ``sink_id`` of ``computation``: the first path in error whose
    segments hold ``sinks/<sink_id>`` (and name ``computation`` where the path names one)."""
    for path, error in sorted(status.items()):
        segments = path.strip("/").split("/")
        pairs = list(itertools.pairwise(segments))
        if ("sinks", sink_id) not in pairs:
            continue
        named = [b for a, b in pairs if a == "computations"]
        if not named or computation in named:
            return error
    return None


def graph_document(sources: Mapping[str, str], computations: Mapping[str, tuple[list[str], list[str]]],
                   source_streams: Mapping[str, str], sinks: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """The pipeline graph: ``sources`` (id → class), ``computations`` (id → (input streams, output
    streams)), ``source_streams`` (source id → its output stream), ``sinks`` (computation id → sink
    id → class). Each edge names the counter whose rate it shows: into a computation, the messages
    appended to the stream (all its partitions' end offsets); into a sink, its deliveries.
    """
    nodes: list[dict[str, Any]] = [{"id": f"source:{s}", "kind": "source", "label": s, "class": c}
                                   for s, c in sources.items()]
    nodes += [{"id": f"computation:{c}", "kind": "computation", "label": c, "class": "computation",
               "inputs": list(inputs)} for c, (inputs, _) in computations.items()]
    edges: list[dict[str, Any]] = []
    producers: dict[str, list[str]] = {}
    for source_id, stream in source_streams.items():
        producers.setdefault(stream, []).append(f"source:{source_id}")
    for computation_id, (_, outputs) in computations.items():
        for stream in outputs:
            producers.setdefault(stream, []).append(f"computation:{computation_id}")
    for computation_id, (inputs, _) in computations.items():
        for stream in inputs:
            for producer in producers.get(stream, []):
                edges.append({"from": producer, "to": f"computation:{computation_id}", "stream": stream,
                              "counter": ["stream", stream]})
    for computation_id, computation_sinks in sinks.items():
        for sink_id, sink_class in computation_sinks.items():
            node = f"sink:{computation_id}/{sink_id}"
            nodes.append({"id": node, "kind": "sink", "label": sink_id, "class": sink_class,
                          "computation": computation_id, "sink_id": sink_id})
            edges.append({"from": f"computation:{computation_id}", "to": node, "stream": None,
                          "counter": ["sink", computation_id, sink_id]})
    return {"nodes": nodes, "edges": edges}
