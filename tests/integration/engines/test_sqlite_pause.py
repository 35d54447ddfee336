"""tests/sqlite_pause.py against a real writer process that holds SQLite's write lock most of the
time: a plain SIGSTOP mostly lands inside its write transaction (the hazard), while
``pause_outside_write_transaction`` always leaves the write lock free for the others."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from egress.engines.sqlite import DATABASE_NAME
from tests.sqlite_pause import pause_outside_write_transaction, stopped, write_lock_taken

pytestmark = pytest.mark.integration

WRITER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("CREATE TABLE IF NOT EXISTS t (x)")
print("ready", flush=True)
while True:  # holds the write lock 20 ms of every 40 ms
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO t VALUES (1)")
    time.sleep(0.02)
    db.execute("COMMIT")
    time.sleep(0.02)
"""


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / DATABASE_NAME)], stdout=subprocess.PIPE)
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"
    yield process
    process.kill()
    process.wait()


def test_a_plain_sigstop_mostly_pauses_a_writer_inside_its_write_transaction(
        tmp_path: Path, writer: subprocess.Popen[bytes]) -> None:
    held = 0
    for _ in range(20):
        writer.send_signal(signal.SIGSTOP)
        while not stopped(writer.pid):
            pass
        held += not write_lock_taken(tmp_path / DATABASE_NAME, timeout=0.1)
        writer.send_signal(signal.SIGCONT)
        # Back-to-back pauses sample one phase of the writer's 40 ms cycle (a fast probe leaves it no
        # time to move on): a random gap of up to two cycles makes the 20 samples independent.
        time.sleep(random.uniform(0, 0.08))
    assert held >= 1  # about half of them; all 20 outside has a chance of about 1 in a million


async def test_a_writer_paused_outside_its_write_transaction_leaves_the_write_lock_free(
        tmp_path: Path, writer: subprocess.Popen[bytes]) -> None:
    for _ in range(5):
        await pause_outside_write_transaction(writer.pid, tmp_path, probe_timeout=0.1)
        assert stopped(writer.pid)
        assert write_lock_taken(tmp_path / DATABASE_NAME, timeout=0.1)
        os.kill(writer.pid, signal.SIGCONT)
