"""``egress throttler serve`` as a real process for the e2e tests, and callers in other processes.

:func:`launch` starts the service and returns it with its port. :func:`launch_callers` starts
``python -m tests.e2e.throttler_callers``: prefetching clients in their own process, over HTTP to
the service, that report every ``throttle(1)`` that returned to a receiver's TCP port.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import REPO

SERVE = "import sys; from egress.cli.throttler import throttler_app; sys.argv[0] = 'egress'; throttler_app()"


def launch(dynamic: Path, port: int = 0, *, state_file: Path | None = None) -> tuple[subprocess.Popen[str], int]:
    """The service on ``dynamic`` (a DynamicSpec file), on ``port`` (0: any free one); its restart
    horizon in ``state_file`` (default: beside ``dynamic``)."""
    state = state_file if state_file is not None else dynamic.with_suffix(".state.json")
    process = subprocess.Popen([sys.executable, "-c", SERVE, "serve", "--dynamic-spec", str(dynamic),
                                "--port", str(port), "--state-file", str(state)],
                               stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert process.stderr is not None
    line = process.stderr.readline()
    found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    assert found, line
    return process, int(found.group(1))


def launch_callers(dynamic: Path, service_port: int, receiver_port: int, name: str, *,
                   classes: list[str], callers: int) -> subprocess.Popen[bytes]:
    """One process with a prefetching client per class of ``classes`` (throttler ``q`` of
    ``dynamic``), ``callers`` callers each; it stops when the receiver closes its connection."""
    return subprocess.Popen([sys.executable, "-m", "tests.e2e.throttler_callers", "--dynamic-spec", str(dynamic),
                             "--service", f"http://127.0.0.1:{service_port}", "--receiver", str(receiver_port),
                             "--name", name, "--classes", ",".join(classes), "--callers", str(callers)], cwd=REPO)
