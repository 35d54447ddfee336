"""End to end: ``egress run`` following a log file (``follow: true``) that is appended to, sometimes
a half line at a time, and rotated (``app.jsonl`` → ``app.jsonl.N``, a new ``app.jsonl`` begun),
while egress is SIGKILLed and restarted 5 times; a final ``--until-drained`` run: every line written
reaches the receiver, each under one stable key."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import orjson
import pytest
import yaml

from tests.e2e.conftest import REPO, RUN_HEADER, Receiver, wait_for_first_request
from tests.e2e.test_kill_restart import load_record

pytestmark = pytest.mark.e2e

KILLS = 5
KILL_DELAY = (0.1, 0.8)
SEED = int(os.environ.get("EGRESS_KILL_SEED", "20261201"))
ROTATE_EVERY = 1500  # lines


class Writer:
    """Appends ``{"id": i, "payload": "line i"}`` lines to ``app.jsonl`` (about 1,000 a second; every
    7th line in two writes, with a pause between), rotating it every ``ROTATE_EVERY`` lines the way a
    logging library does: close, rename to ``app.jsonl.N``, open a new ``app.jsonl``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.count = 0
        self.rotations = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._write, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.count

    def _write(self) -> None:
        path = self.folder / "app.jsonl"
        file = open(path, "ab", buffering=0)  # noqa: SIM115 - reopened at each rotation
        while not self._stop.is_set():
            for _ in range(20):
                line = orjson.dumps({"id": self.count, "payload": f"line {self.count}"}) + b"\n"
                if self.count % 7 == 0:
                    file.write(line[:5])
                    time.sleep(0.003)
                    file.write(line[5:])
                else:
                    file.write(line)
                self.count += 1
                if self.count % ROTATE_EVERY == 0:
                    file.close()
                    self.rotations += 1
                    os.rename(path, self.folder / f"app.jsonl.{self.rotations}")
                    file = open(path, "ab", buffering=0)  # noqa: SIM115
            time.sleep(0.02)
        file.close()


def write_spec(directory: Path, port: int, run: int) -> Path:
    spec = {
        "pipeline": "follow_kill",
        "partition_count": 2,
        "streams": {
            "events": {"schema": [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}],
                       "group_by": ["id"]},
            "requests": {"schema": [{"name": "payload", "type": "string"}]},
        },
        # The glob matches the rotated names too, so a file rotated twice while egress is down is read.
        "sources": {"logs": {"source_class_name": "jsonl", "output_stream_id": "events",
                             "parameters": {"path": str(directory / "logs" / "app.jsonl*"), "follow": True}}},
        "computations": {"deliver": {
            "processing_function": "tests.pipelines:Passthrough",
            "input_stream_ids": ["events"], "output_stream_ids": ["requests"],
            "sinks": {"http": {"sink_class_name": "async_http", "input_stream_ids": ["requests"],
                               "parameters": {"url": f"http://127.0.0.1:{port}/events", "payload_column": "payload",
                                              "headers": {RUN_HEADER: str(run)}}}},
        }},
    }
    path = directory / f"spec-run{run}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def start(directory: Path, spec: Path, run: int, *options: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = directory / f"run{run}.log"
    with log.open("wb") as output:
        process = subprocess.Popen([sys.executable, "-m", "egress", "run", str(spec), "--state-dir",
                                    str(directory / "state"), "--quiet", *options],
                                   cwd=REPO, stdout=output, stderr=subprocess.STDOUT)
    return process, log


@pytest.mark.timeout(240)
def test_a_followed_file_appended_and_rotated_across_five_sigkills_is_delivered_whole(
        tmp_path: Path, receiver: Receiver) -> None:
    (tmp_path / "logs").mkdir()
    rng = random.Random(SEED)
    writer = Writer(tmp_path / "logs")
    writer.start()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for run in range(KILLS):
            process, log = start(tmp_path, write_spec(tmp_path, receiver.port, run), run)
            processes.append(process)
            wait_for_first_request(receiver.record, run, process, log)
            time.sleep(rng.uniform(*KILL_DELAY))
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            assert process.returncode == -signal.SIGKILL, log.read_text()
        written = writer.stop()
        process, log = start(tmp_path, write_spec(tmp_path, receiver.port, KILLS), KILLS, "--until-drained")
        processes.append(process)
        assert process.wait(timeout=120) == 0, log.read_text()
    finally:
        writer.stop()
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    requests = [r for r in load_record(receiver.record) if 200 <= r.status <= 299]
    keys_of: dict[str, set[str]] = defaultdict(set)
    bodies_of: dict[str, set[str]] = defaultdict(set)
    for request in requests:
        keys_of[request.body].add(request.key)
        bodies_of[request.key].add(request.body)
    want = {hashlib.sha256(f"line {i}".encode()).hexdigest() for i in range(written)}
    missing = want - keys_of.keys()
    assert writer.rotations >= 2
    assert not missing, f"{len(missing)} of {written} lines never delivered"
    assert keys_of.keys() == want
    assert all(len(keys) == 1 for keys in keys_of.values()), "a line was sent under two keys"
    assert all(len(bodies) == 1 for bodies in bodies_of.values()), "a key carried two lines"
    print(f"\n{written} lines written, {writer.rotations} rotations, {len(requests)} requests")
