"""Waiting on the ``egress run`` subprocesses of the kill tests from their event loop."""

from __future__ import annotations

import asyncio
import signal
import subprocess


async def kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``process`` and wait (in a thread) until it is gone."""
    process.send_signal(signal.SIGKILL)
    await asyncio.to_thread(process.wait, 30)


async def exits_zero(process: subprocess.Popen[bytes], within: float) -> None:
    """Wait up to ``within`` seconds (in a thread) for ``process`` to end, and fail with its stderr
    unless it exited 0; a process still running then is killed."""
    try:
        code = await asyncio.to_thread(process.wait, within)
        assert code == 0, process.stderr.read() if process.stderr else b""
    finally:
        if process.poll() is None:
            process.kill()
            await asyncio.to_thread(process.wait, 30)
