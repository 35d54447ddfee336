"""The one-line errors of a command that cannot listen on its address or use its state directory:
each names the option to change and how, as every other error of the command line does."""

from __future__ import annotations

import errno
from pathlib import Path


def cannot_listen(host: str, port: int, error: OSError, *, port_option: str, host_option: str = "--host") -> str:
    """The line for ``error`` raised binding ``host:port``, e.g. ``cannot listen on 127.0.0.1:8080
    (--port): address already in use; stop what listens there or give another --port (0 picks a free
    one)``. ``port_option`` and ``host_option`` are the options that set the address."""
    reason = (error.strerror or str(error)).lower()
    if reason.startswith("error while attempting to bind"):  # asyncio's wording repeats the address
        reason = reason.rsplit("): ", 1)[-1]
    option = port_option
    if "address already in use" in reason or error.errno == errno.EADDRINUSE:
        reason, fix = "address already in use", (f"stop what listens there or give another {port_option} "
                                                 "(0 picks a free one)")
    elif error.errno == errno.EACCES:
        fix = f"give a {port_option} of 1024 or above, or run with the right to bind it"
    else:
        option, fix = host_option, f"give an address of this machine as {host_option} (127.0.0.1: this machine only)"
    return f"cannot listen on {host}:{port} ({option}): {reason}; {fix}"


def unusable_state_dir(directory: Path) -> str | None:
    """Why ``directory`` cannot be a state directory (a path that exists and is not a directory), or
    ``None``: a missing directory is created by the run."""
    if directory.exists() and not directory.is_dir():
        return (f"--state-dir {directory}: not a directory; give --state-dir a directory (created when "
                "missing), e.g. the default .egress/<pipeline>")
    return None
