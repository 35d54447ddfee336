"""Fixtures of the sources' end-to-end tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def workers() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """The ``egress run`` processes a test starts, by name; SIGKILLed at the end if still running."""
    started: dict[str, subprocess.Popen[bytes]] = {}
    yield started
    for process in started.values():
        if process.poll() is None:
            process.kill()
            process.wait()
