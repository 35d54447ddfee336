"""Firehose throughput (issue 6): the ``firehose_http`` sink delivering all 336,776 flights of 2013 to
the egress Firehose receiver, gzip off and on, and the receiver's own records/s, in one run.

What is measured, on loopback only, with ``egress receiver --protocol firehose`` in a subprocess
(one access key, no ``--record``), restarted for each phase so its ``GET /stats`` belong to it:

1. The records: every row of ``data/flights-2013.csv.gz`` typed as the csv source types it and
   turned into its record by ``examples/firehose_delivery/functions.py`` (compact JSON, ~307 bytes;
   all 336,776 flights, cancelled ones included). "payload" below is the sum of the record bytes
   (before base64 and gzip): 103,494,468 bytes = 98.7 MiB.
2. ``sink gzip=none`` / ``sink gzip=gzip`` (and ``+flush``, see :func:`run_sink`): a
   :class:`FirehoseHttpSink` in this process, with the example's parameters (``size_in_mbs`` 1,
   ``interval_in_seconds`` 1, ``max_in_flight`` 4, compression level 6, an access key, common
   attributes), fed as a partition job feeds it:
   committed messages in chunks of 2,048 (``RunOptions.epoch_max_messages``), holding back while
   8,192 or more are unacknowledged (``RunOptions.max_unacknowledged``), ``progress()`` after
   every acknowledgement. The figure is payload MiB / wall time from the first ``distribute`` to the
   last acknowledgement, and records / that time. Every phase must deliver every record: the
   receiver's counts of records and record bytes are checked (exit 1 otherwise).
3. ``receiver gzip=none`` / ``gzip``: the same records pre-encoded as Firehose requests (batches of
   1 MiB of records as the sink makes them, bodies built and compressed before the clock starts),
   POSTed by one libcurl client with 4 requests in flight; the receiver's records/s = records / wall
   time, and its CPU seconds (``/proc/<pid>/stat`` utime + stime) for those records.
4. ``egress run`` (``--e2e``, on by default): ``examples/firehose_delivery`` itself, with gzip, from
   a fresh state directory: records / wall time of the whole ``egress run --until-drained`` process
   (csv source into the log, process function, SQLite commits, the sink).

Run from the repository root (figures and interpretation: ``docs/benchmarks.md``)::

    python benchmarks/firehose.py              # all phases, ~1.5 minutes on 2 cores
    python benchmarks/firehose.py --no-e2e     # the sink and receiver phases only
    python benchmarks/firehose.py --rows 50000 # a slice

The last line is one comparable summary; the target is >= 20 MiB/s of payload for the sink.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from examples.firehose_delivery.functions import flight_record  # noqa: E402

from egress.clock import RealClock  # noqa: E402
from egress.connectors.base import SinkContext  # noqa: E402
from egress.connectors.sinks.firehose_http import FirehoseHttpSink, batch_request_id  # noqa: E402
from egress.connectors.sinks.firehose_parameters import (  # noqa: E402
    FirehoseHttpSinkDynamicParameters,
    FirehoseHttpSinkParameters,
)
from egress.engines import OutboxMessage, SinkProgress  # noqa: E402
from egress.firehose import protocol as p  # noqa: E402
from egress.httpclient import CurlClient, Request  # noqa: E402
from egress.observe import Metrics, StatusTree  # noqa: E402

DATA = REPO / "data" / "flights-2013.csv.gz"
EXAMPLE = REPO / "examples" / "firehose_delivery"
KEY_VARIABLE = "FIREHOSE_BENCH_KEY"
KEY = "bench-key-0123456789"
ARN = "arn:aws:firehose:local:000000000000:deliverystream/bench"
MIB = 1024 * 1024
EPOCH_MESSAGES = 2048
MAX_UNACKNOWLEDGED = 8192
TARGET_MIB_S = 20.0
CASTS = {"int64": int, "double": float, "string": str}


def flight_records(rows: int | None) -> list[bytes]:
    """The example's records of the first ``rows`` flights (all when ``None``), typed as the csv source
    types them (``NA`` or empty is null in a nullable column)."""
    schema = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())["streams"]["flights"]["schema"]
    records = []
    with gzip.open(DATA, "rt", newline="") as file:
        for index, raw in enumerate(csv.DictReader(file)):
            if rows is not None and index >= rows:
                break
            row: dict[str, Any] = {}
            for column in schema:
                text = raw[column["name"]]
                nullable = not column.get("required", False)
                row[column["name"]] = None if nullable and text in ("NA", "") else CASTS[column["type"]](text)
            records.append(flight_record(row).encode())
    return records


# -- the receiver process ---------------------------------------------------------------------------


@dataclass
class Receiver:
    process: subprocess.Popen[str]
    url: str

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "stats", timeout=30) as response:
            result: dict[str, Any] = json.loads(response.read())
            return result

    def cpu_seconds(self) -> float:
        """utime + stime of the receiver process (``/proc/<pid>/stat`` fields 14 and 15)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_receiver() -> Receiver:
    process = subprocess.Popen(
        [sys.executable, "-m", "egress", "receiver", "--protocol", "firehose", "--port", "0",
         "--access-key-env", KEY_VARIABLE],
        cwd=REPO, stdout=subprocess.PIPE, text=True, env={**os.environ, KEY_VARIABLE: KEY})
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r"listening on (http://127\.0\.0\.1:\d+/)", line)
    if not found:
        process.kill()
        raise SystemExit(f"the receiver did not start: {line!r}")
    return Receiver(process, found.group(1))


# -- phases ----------------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    records: int
    payload_bytes: int
    seconds: float
    requests: int
    receiver_cpu: float
    note: str = ""

    @property
    def mib_s(self) -> float:
        return self.payload_bytes / MIB / self.seconds

    @property
    def records_s(self) -> float:
        return self.records / self.seconds

    def describe(self) -> str:
        return (f"{self.name}: {self.records:,} records, {self.payload_bytes / MIB:.1f} MiB in {self.seconds:.2f} s"
                f" = {self.mib_s:.1f} MiB/s, {self.records_s:,.0f} records/s; {self.requests} requests; "
                f"receiver CPU {self.receiver_cpu:.1f} s{self.note}")


def sink_parameters(url: str, encoding: str) -> FirehoseHttpSinkParameters:
    spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    parameters = dict(spec["computations"]["to_record"]["sinks"]["firehose"]["parameters"])
    parameters.update(url=url, payload_column="record", content_encoding=encoding,
                      access_key={"env": KEY_VARIABLE})
    return FirehoseHttpSinkParameters.model_validate(parameters)


async def run_sink(records: list[bytes], encoding: str, flush_hook: bool) -> Result:
    """Phase 2: the sink fed as a partition job feeds it; checked against the receiver's counts.

    ``flush_hook``: also call ``sink.flush()`` where a partition job would with the proposed hook
    (when it holds back at ``max_unacknowledged`` and at the end of the input); without it, the last
    partial batch waits ``interval_in_seconds`` (1 s) as it does under ``egress run`` today.
    """
    os.environ[KEY_VARIABLE] = KEY
    receiver = start_receiver()
    try:
        wake = asyncio.Event()
        context = SinkContext("to_record", "firehose", 0, RealClock(), Metrics(), StatusTree(),
                              lambda _progress: wake.set())
        sink = FirehoseHttpSink(context, sink_parameters(receiver.url, encoding),
                                FirehoseHttpSinkDynamicParameters(), SinkProgress())
        messages = [OutboxMessage(seq, "records", seq.to_bytes(16, "big"), b"[]", None, {"record": record.decode()})
                    for seq, record in enumerate(records, start=1)]
        cpu_before = receiver.cpu_seconds()
        started = time.perf_counter()
        for first in range(0, len(messages), EPOCH_MESSAGES):
            while sink.unacknowledged >= MAX_UNACKNOWLEDGED:
                if flush_hook:
                    sink.flush()
                wake.clear()
                sink.committed(sink.progress())  # a job commits the sink's progress and state each epoch
                if sink.unacknowledged >= MAX_UNACKNOWLEDGED:
                    await wake.wait()
                if sink.terminal_error:
                    raise SystemExit(f"sink failed: {sink.terminal_error}")
            sink.distribute(messages[first:first + EPOCH_MESSAGES])
            sink.committed(sink.progress())
            await asyncio.sleep(0)
        if flush_hook:
            sink.flush()
        while sink.progress().max_persisted_seq_no < len(messages):
            wake.clear()
            sink.committed(sink.progress())
            await wake.wait()
            if sink.terminal_error:
                raise SystemExit(f"sink failed: {sink.terminal_error}")
        seconds = time.perf_counter() - started
        await sink.close()
        cpu = receiver.cpu_seconds() - cpu_before
        stats = receiver.stats()
    finally:
        receiver.stop()
    payload = sum(map(len, records))
    name = f"sink gzip={encoding}" + (" +flush" if flush_hook else "")
    check(stats, len(records), payload, name)
    return Result(name, len(records), payload, seconds, stats["requests"], cpu)


def request_bodies(records: list[bytes], gzip_body: bool) -> list[tuple[str, int, bytes]]:
    """The records cut as the sink cuts them (1 MiB of record data per batch), encoded (and gzip'd)."""
    bodies = []
    start, size = 0, 0
    for index, record in enumerate(records):
        if index > start and (size + len(record) > MIB or index - start >= p.MAX_RECORDS_PER_REQUEST):
            bodies.append(encode(records, start, index, gzip_body))
            start, size = index, 0
        size += len(record)
    bodies.append(encode(records, start, len(records), gzip_body))
    return bodies


def encode(records: list[bytes], start: int, end: int, gzip_body: bool) -> tuple[str, int, bytes]:
    request_id = batch_request_id("bench", start.to_bytes(8, "big"), end.to_bytes(8, "big"))
    body = p.encode_request_body(request_id, int(time.time() * 1000), records[start:end])
    return request_id, end - start, p.gzip_compress(body) if gzip_body else body


async def run_receiver(records: list[bytes], gzip_body: bool, in_flight: int = 4) -> Result:
    """Phase 3: pre-encoded requests, ``in_flight`` at once; the receiver's records/s and CPU."""
    bodies = request_bodies(records, gzip_body)
    receiver = start_receiver()
    client = CurlClient(max_connections=in_flight)
    try:
        pending = iter(bodies)

        async def worker() -> None:
            for request_id, _, body in pending:
                headers = p.request_headers(request_id, source_arn=ARN, access_key=KEY, gzip_body=gzip_body)
                response = await client.send(Request(receiver.url, body, tuple(f"{k}: {v}" for k, v in headers.items()),
                                                     timeout=180, capture_body=True))
                if response.status != 200:
                    raise SystemExit(f"receiver answered {response.status}: {response.body!r}")

        cpu_before = receiver.cpu_seconds()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        seconds = time.perf_counter() - started
        cpu = receiver.cpu_seconds() - cpu_before
        stats = receiver.stats()
    finally:
        client.close()
        receiver.stop()
    payload = sum(map(len, records))
    name = f"receiver gzip={'gzip' if gzip_body else 'none'}"
    check(stats, len(records), payload, name)
    wire = sum(len(body) for _, _, body in bodies)
    return Result(name, len(records), payload, seconds, len(bodies), cpu,
                  f" ({len(records) / cpu:,.0f} records per receiver CPU second; {wire / MIB:.1f} MiB on the wire)")


def run_e2e(rows: int | None) -> Result:
    """Phase 4: ``egress run`` of examples/firehose_delivery (gzip), whole process, fresh state."""
    receiver = start_receiver()
    work = Path(tempfile.mkdtemp(prefix="egress-firehose-bench-"))
    try:
        spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
        data = DATA
        if rows is not None:
            data = work / "flights.csv.gz"
            with gzip.open(DATA, "rt", newline="") as source, gzip.open(data, "wt", newline="") as target:
                target.writelines(line for _, line in zip(range(rows + 1), source, strict=False))
        spec["sources"]["flights_csv"]["parameters"]["path"] = str(data)
        spec["computations"]["to_record"]["sinks"]["firehose"]["parameters"]["url"] = receiver.url
        spec["computations"]["to_record"]["sinks"]["firehose"]["parameters"]["access_key"] = {"env": KEY_VARIABLE}
        spec_path = work / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        cpu_before = receiver.cpu_seconds()
        started = time.perf_counter()
        run = subprocess.run(
            [sys.executable, "-m", "egress", "run", str(spec_path),
             "--dynamic-spec", str(EXAMPLE / "dynamic_spec.yaml"),
             "--state-dir", str(work / "state"), "--until-drained", "--quiet"],
            cwd=REPO, capture_output=True, text=True, timeout=900, check=False, env={**os.environ, KEY_VARIABLE: KEY})
        seconds = time.perf_counter() - started
        cpu = receiver.cpu_seconds() - cpu_before
        if run.returncode != 0:
            raise SystemExit(f"egress run exited {run.returncode}:\n{run.stdout}\n{run.stderr}")
        stats = receiver.stats()
    finally:
        receiver.stop()
        shutil.rmtree(work, ignore_errors=True)
    return Result("egress run (example, gzip)", stats["records"], stats["record_bytes"], seconds, stats["requests"],
                  cpu, " (whole process: csv source, log, process function, SQLite commits, sink)")


def check(stats: dict[str, Any], records: int, payload: int, name: str) -> None:
    if stats["records"] != records or stats["record_bytes"] != payload:
        raise SystemExit(f"{name}: the receiver got {stats['records']:,} records / {stats['record_bytes']:,} bytes, "
                         f"expected {records:,} / {payload:,}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=None, help="only the first N flights (default: all 336,776)")
    parser.add_argument("--e2e", action=argparse.BooleanOptionalAction, default=True,
                        help="also time `egress run` of the example (default on)")
    args = parser.parse_args(argv)
    records = flight_records(args.rows)
    payload = sum(map(len, records))
    print(f"{len(records):,} flight records, {payload / MIB:.1f} MiB of payload, "
          f"{payload / len(records):.0f} bytes on average", flush=True)
    results: dict[str, Result] = {}
    for phase in phases(records, args):
        results[phase.name] = phase
        print("  " + phase.describe(), flush=True)
    plain, gzipped = results["sink gzip=none"], results["sink gzip=gzip"]
    plain_f, gzipped_f = results["sink gzip=none +flush"], results["sink gzip=gzip +flush"]
    for label, pair in (("as driven today", (plain, gzipped)), ("with the flush hook", (plain_f, gzipped_f))):
        verdict = "PASS" if min(r.mib_s for r in pair) >= TARGET_MIB_S else "MISS"
        print(f"target: sink >= {TARGET_MIB_S:.0f} MiB/s of payload with and without gzip, {label}: {verdict}")
    e2e = results.get("egress run (example, gzip)")
    print(f"firehose: sink {plain.mib_s:.1f} MiB/s {plain.records_s:,.0f} rec/s (none), "
          f"{gzipped.mib_s:.1f} MiB/s {gzipped.records_s:,.0f} rec/s (gzip); +flush {plain_f.mib_s:.1f} / "
          f"{gzipped_f.mib_s:.1f} MiB/s | receiver "
          f"{results['receiver gzip=none'].records_s:,.0f} rec/s (none), "
          f"{results['receiver gzip=gzip'].records_s:,.0f} rec/s (gzip)"
          + (f" | egress run {e2e.mib_s:.1f} MiB/s {e2e.records_s:,.0f} rec/s" if e2e else "")
          + f" | {len(records):,} flights, {payload / MIB:.1f} MiB")
    return 0


def phases(records: list[bytes], args: argparse.Namespace) -> Iterator[Result]:
    for flush_hook in (False, True):
        for encoding in ("none", "gzip"):
            yield asyncio.run(run_sink(records, encoding, flush_hook))
    for gzip_body in (False, True):
        yield asyncio.run(run_receiver(records, gzip_body))
    if args.e2e:
        yield run_e2e(args.rows)


if __name__ == "__main__":
    sys.exit(main())
