"""examples/firehose_delivery as a user runs it: ``egress receiver --protocol firehose`` and
``egress run --until-drained`` as processes, on the first 30,000 flights of 2013 (the full 336,776
take about 25 s alone and longer on a busy machine; ``benchmarks/firehose.py`` runs them all).

Every record must arrive, exactly: the receiver's ``--record`` file gives, per accepted request, the
number of records and a SHA-256 over them (each prefixed by its 8-byte big-endian length). Each
request of a partition's sink carries a contiguous run of that partition's records in input order,
so walking each partition's expected records and matching (count, digest) of the requests tiles the
whole input, or fails naming where.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from egress.keys import encode_key, partition_of
from tests.conftest import REPO
from tests.e2e.conftest import FIREHOSE_ACCESS_KEY, assert_firehose_requests_tile
from tests.receiver_record import recorded

pytestmark = pytest.mark.e2e
EXAMPLE = REPO / "examples" / "firehose_delivery"
DATA = REPO / "data" / "flights-2013.csv.gz"
ROWS = 30_000
CASTS = {"int64": int, "double": float, "string": str}


def typed_rows(lines: list[str], schema: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The rows as the csv source types them: ``NA`` or empty is null in a nullable column."""
    for raw in csv.DictReader(io.StringIO("".join(lines))):
        row: dict[str, Any] = {}
        for column in schema:
            text = raw[column["name"]]
            nullable = not column.get("required", False)
            row[column["name"]] = None if nullable and text in ("NA", "") else CASTS[column["type"]](text)
        yield row



@pytest.mark.timeout(120)
def test_every_flight_arrives_once_in_order(tmp_path: Path, firehose_receiver: tuple[int, Path]) -> None:
    port, record = firehose_receiver
    with gzip.open(DATA, "rt", newline="") as file:
        lines = [line for _, line in zip(range(ROWS + 1), file, strict=False)]
    data = tmp_path / "flights.csv.gz"
    with gzip.open(data, "wt", newline="") as file:
        file.writelines(lines)

    spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    spec["sources"]["flights_csv"]["parameters"]["path"] = str(data)
    sink = spec["computations"]["to_record"]["sinks"]["firehose"]["parameters"]
    sink["url"] = f"http://127.0.0.1:{port}/"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))

    run = subprocess.run(
        [sys.executable, "-m", "egress", "run", str(spec_path), "--dynamic-spec", str(EXAMPLE / "dynamic_spec.yaml"),
         "--state-dir", str(tmp_path / "state"), "--until-drained", "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=100, check=False,
        env={**os.environ, "FIREHOSE_ACCESS_KEY": FIREHOSE_ACCESS_KEY})
    assert run.returncode == 0, run.stdout + run.stderr

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as response:
        stats = json.loads(response.read())
    count = spec["partition_count"]
    expected: list[list[bytes]] = [[] for _ in range(count)]
    for row in typed_rows(lines, spec["streams"]["flights"]["schema"]):
        expected[partition_of(encode_key([row["origin"]]), count)].append(orjson.dumps(row))
    total = sum(map(len, expected))
    assert total == ROWS
    assert stats["records"] == ROWS
    assert stats["record_bytes"] == sum(len(r) for part in expected for r in part)
    assert stats["repeated_request_ids"] == 0
    assert stats["by_status"] == {"200": stats["requests"]}

    requests = recorded(record)
    assert all(r["commonAttributes"] == {"dataset": "nycflights13", "year": "2013"} for r in requests)
    assert_firehose_requests_tile(expected, requests)
    assert len(requests) >= ROWS * 300 // (1024 * 1024)  # batches of at most 1 MiB of records
