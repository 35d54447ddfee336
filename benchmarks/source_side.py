"""CPU per record of the source side alone: a ``jsonl`` file read, typed, keyed and chunked into log appends.

The input and the source are the delivery benchmark's (``benchmarks/delivery.py``: ``write_source``'s
JSONL of flight payloads, ``{"id": i, "payload": "<flight JSON>"}``, ``benchmark_spec``'s source,
stream (``id`` the key) and 4 partitions). :class:`SourceReader` runs it to its end as a run does
(chunks of ``source_chunk`` records on asyncio's worker thread), on :class:`CountingEngine`, whose
commit only counts the appends: what is timed is reading, checking rows, keys, partitions, message
ids and chunking. CPU is ``time.process_time`` (every thread), the best of ``--runs``.

Run it from the repository root, alternating two checkouts to compare them (same interpreter)::

    PYTHONPATH=src python benchmarks/source_side.py
    PYTHONPATH=/path/to/other/src python benchmarks/source_side.py --digest   # + a hash of every append
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import egress  # noqa: E402
from delivery import SOURCE_ID, benchmark_spec, build_bodies, write_source  # noqa: E402
from egress.engines import Checkpoint, KeyedState  # noqa: E402
from egress.observe import Metrics  # noqa: E402
from egress.runtime import RunOptions  # noqa: E402
from egress.runtime.plan import build_plan  # noqa: E402
from egress.runtime.source_reader import SourceReader  # noqa: E402
from egress.spec import DynamicSpec, Spec  # noqa: E402

PARTITIONS = 4


class CountingEngine:
    """The engine calls of a source reader, committing nothing: a commit counts its appends (and,
    with ``digest``, hashes them: stream, partition, message id, key, timestamp, row)."""

    def __init__(self, digest: bool) -> None:
        self.appended = 0
        self.hash = hashlib.sha256() if digest else None

    async def acquire(self, consumer: str, partition: int) -> int:
        return 1

    async def load_checkpoint(self, consumer: str, partition: int, sinks: list[str]) -> Checkpoint:
        return Checkpoint({}, {}, [], 1)

    async def load_keyed_state(self, *arguments: Any) -> KeyedState:
        return KeyedState({}, {}, [], None)

    async def commit(self, commit: Any) -> None:
        self.appended += len(commit.log_appends)
        if self.hash is not None:
            self.hash.update(orjson.dumps(commit.input_positions[("", 0)]))
            for stream, partition, message_id, key, timestamp, row in commit.log_appends:
                self.hash.update(orjson.dumps([stream, partition, message_id.hex(), key.decode(), timestamp, row]))

    async def write_meta(self, key: str, value: str) -> None:
        pass


def read_once(source: Path, digest: bool = False) -> tuple[float, CountingEngine]:
    """CPU seconds of one source reader over ``source`` to its end, and its engine."""
    # The path relative to the Spec's folder: it scopes the message ids, so the digest does not depend on the folder.
    spec = Spec.model_validate(benchmark_spec("delivery_benchmark", PARTITIONS, Path(source.name), {})
                               | {"computations": {}})
    plan = build_plan(spec, DynamicSpec(), base_dir=source.parent).sources[SOURCE_ID]
    engine = CountingEngine(digest)
    reader = SourceReader(plan, engine, source.parent, PARTITIONS, Metrics(), RunOptions(),  # type: ignore[arg-type]
                          lambda partition: None, "delivery_benchmark")
    started = time.process_time()
    asyncio.run(reader.run())
    return time.process_time() - started, engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--digest", action="store_true", help="also print a SHA-256 of every log append")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "payloads.jsonl"
        write_source(source, build_bodies(min(options.messages, 100_000)), options.messages)
        best = min(read_once(source)[0] for _ in range(options.runs))
        _, engine = read_once(source, options.digest)
    print(f"{Path(egress.__file__).parent}: {best * 1e6 / engine.appended:.2f} µs CPU per record "
          f"(best of {options.runs}, {engine.appended:,} records)")
    if engine.hash is not None:
        print(f"appends sha256 {engine.hash.hexdigest()}")


if __name__ == "__main__":
    main()
