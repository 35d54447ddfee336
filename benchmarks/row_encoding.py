"""Row encoding: orjson against ormsgpack on the demo's rows (issue 10), in one process.

What is measured: the rows ``examples/http_delivery`` stores, as egress makes them:

1. ``flight``: the typed flight rows of ``examples/http_delivery/spec.yaml`` (January 2013, 27,004;
   ``--rows`` takes fewer) exactly as its csv source produces them (19 columns: ints, doubles,
   strings, nulls); the log stores one per message.
2. ``payload``: the outbox row the example's process function emits for each, ``{"payload": <the
   orjson of the flight row as str>}`` (~300 bytes; cancelled flights give ``None``).
3. ``binary``: the same payloads as ``bytes`` (what a process function emitting bytes stores), which
   only MessagePack can hold.

For each: ``orjson.dumps`` / ``orjson.loads`` and ``ormsgpack.packb`` / ``ormsgpack.unpackb`` per
row, and ``egress.rows.decode_row`` (what the engine reads with, which tells JSON rows of old
directories apart by their first byte), in batches of 2,048 rows as an epoch commits and reads them
(``epoch_max_messages``; each batch's results are kept until the batch is done, as the engine keeps
them for one ``executemany``), best of ``--repeat`` (default 5) passes over all rows, in µs per
row, plus the stored size. Run it from the repository root (figures: ``docs/benchmarks.md``)::

    python benchmarks/row_encoding.py
    python benchmarks/row_encoding.py --rows 10000 --repeat 3
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import ormsgpack

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from egress.rows import decode_row  # noqa: E402
from egress.runtime import load_plan  # noqa: E402

SPEC = REPO / "examples" / "http_delivery" / "spec.yaml"


def flight_rows(count: int | None) -> list[dict[str, Any]]:
    """The first ``count`` (all: ``None``) rows of the example's csv source, typed as egress types them."""
    plan = load_plan(SPEC)
    source_plan = plan.sources["flights_csv"]
    source = source_plan.source_class.create(source_plan.source_id, source_plan.parameters, source_plan.stream,
                                             plan.base_dir)
    return [record.row for record in itertools.islice(source.records(0), count)]


BATCH = 2048


def best_of(repeat: int, function: Callable[[Any], object], items: Sequence[Any]) -> float:
    """The fastest of ``repeat`` passes of ``function`` over ``items`` in batches of :data:`BATCH`,
    in µs per item."""
    batches = [items[start:start + BATCH] for start in range(0, len(items), BATCH)]
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        for batch in batches:
            function(batch)
        times.append(time.perf_counter() - started)
    return min(times) * 1e6 / len(items)


def measure(name: str, rows: list[dict[str, Any]], repeat: int) -> list[str]:
    lines = []
    json_ok = all(isinstance(v, str | int | float | type(None)) for row in rows for v in row.values())
    packed = [ormsgpack.packb(row) for row in rows]
    assert [ormsgpack.unpackb(p) for p in packed] == rows
    pack = best_of(repeat, lambda batch: [ormsgpack.packb(row) for row in batch], rows)
    unpack = best_of(repeat, lambda batch: [ormsgpack.unpackb(p) for p in batch], packed)
    engine = best_of(repeat, lambda batch: [decode_row(p) for p in batch], packed)
    size = sum(map(len, packed)) / len(rows)
    if json_ok:
        dumped = [orjson.dumps(row) for row in rows]
        assert [orjson.loads(d) for d in dumped] == rows
        dumps = best_of(repeat, lambda batch: [orjson.dumps(row) for row in batch], rows)
        loads = best_of(repeat, lambda batch: [orjson.loads(d) for d in batch], dumped)
        json_size = sum(map(len, dumped)) / len(rows)
        lines.append(f"  {name:<8} orjson     encode {dumps:5.2f} µs  decode {loads:5.2f} µs  {json_size:6.1f} bytes")
    else:
        lines.append(f"  {name:<8} orjson     cannot store bytes")
    lines.append(f"  {name:<8} ormsgpack  encode {pack:5.2f} µs  decode {unpack:5.2f} µs  {size:6.1f} bytes"
                 f"  (decode_row {engine:5.2f} µs)")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=None, help="flight rows (default all 27,004 of January)")
    parser.add_argument("--repeat", type=int, default=5, help="passes per figure, the best is kept (default 5)")
    args = parser.parse_args(argv)
    flights = flight_rows(args.rows)
    payloads = [{"payload": None if row["dep_time"] is None else orjson.dumps(row).decode()} for row in flights]
    binary = [{"payload": None if p["payload"] is None else p["payload"].encode()} for p in payloads]
    print(f"row encoding, {len(flights):,} rows of {SPEC.relative_to(REPO)}, best of {args.repeat}, per row; "
          f"orjson {orjson.__version__}, ormsgpack {ormsgpack.__version__}, Python {sys.version.split()[0]}, "
          f"load average {os.getloadavg()[0]:.2f}")
    for name, rows in (("flight", flights), ("payload", payloads), ("binary", binary)):
        for line in measure(name, rows, args.repeat):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
