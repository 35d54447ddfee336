"""Fixtures of the sources' end-to-end tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Receiver
from tests.e2e.runtime.test_kill_restart import load_record
from tests.waiting import eventually_sync


@pytest.fixture
def workers() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """The ``egress run`` processes a test starts, by name; SIGKILLed at the end if still running."""
    started: dict[str, subprocess.Popen[bytes]] = {}
    yield started
    for process in started.values():
        if process.poll() is None:
            process.kill()
            process.wait()


def wait_until_delivered(receiver: Receiver, keys: Iterable[str], what: str, log: Path) -> None:
    """Wait until the receiver answered 2xx to a request under each of ``keys``; on a timeout the
    failure names the missing keys and ends with the tail of ``log`` (the surviving worker's)."""
    wanted = set(keys)

    def missing() -> list[str]:
        delivered = {r.key for r in load_record(receiver.record) if 200 <= r.status <= 299}
        return sorted(wanted - delivered)

    eventually_sync(lambda: not missing(), timeout=90, interval=0.2, what=what,
                    details=lambda: f"{len(missing())} never arrived, e.g. {missing()[:5]}\n"
                    + log.read_text(errors="replace")[-3000:])
