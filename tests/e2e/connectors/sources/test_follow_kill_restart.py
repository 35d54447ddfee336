"""End to end: ``egress run`` following a log file (``follow: true``) that is appended to, sometimes
a half line at a time, and rotated (``app.jsonl`` → ``app.jsonl.N``, a new ``app.jsonl`` begun),
while egress is SIGKILLed and restarted 5 times; a final ``--until-drained`` run: every line written
reaches the receiver, each under one stable key. Read by one reader, and by two (``readers: 2``:
reader 0 deals each new file, the commits of a batch overlap the reading of the next)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from tests.e2e.conftest import Receiver
from tests.e2e.live_inputs import kill_restart_then_drain, pass_through_spec
from tests.e2e.runtime.test_kill_restart import load_record
from tests.waiting import eventually_sync

pytestmark = pytest.mark.e2e

ROTATE_EVERY = 1500  # lines
LINES_PER_RUN = 700  # lines written before each kill, at the least: 5 kills see 3,500, two rotations


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


@pytest.mark.timeout(240)
@pytest.mark.parametrize("readers", [1, 2])
def test_a_followed_file_appended_and_rotated_across_five_sigkills_is_delivered_whole(
        tmp_path: Path, receiver: Receiver, readers: int) -> None:
    (tmp_path / "logs").mkdir()
    writer = Writer(tmp_path / "logs")
    writer.start()
    # The glob matches the rotated names too, so a file rotated twice while egress is down is read.
    source = {"source_class_name": "jsonl", "parameters": {"path": str(tmp_path / "logs" / "app.jsonl*"),
                                                            "follow": True, "readers": readers}}
    try:
        written = kill_restart_then_drain(
            tmp_path, receiver, lambda run: pass_through_spec(tmp_path, "follow_kill", source, receiver.port, run),
            writer.stop, lambda run: eventually_sync(lambda: writer.count >= LINES_PER_RUN * (run + 1),
                                                     what=f"{LINES_PER_RUN * (run + 1)} lines written"))
    finally:
        writer.stop()

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
