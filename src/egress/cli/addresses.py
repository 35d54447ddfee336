"""The one-line errors of a command that cannot listen on its address, use its state directory or
write the file an option names: each names the option to change and how, as every other error of
the command line does."""

from __future__ import annotations

from pathlib import Path

import typer

from egress.listen_errors import bind_failure


def cannot_listen(host: str, port: int, error: OSError, *, port_option: str, host_option: str = "--host") -> str:
    """The line for ``error`` raised binding ``host:port``, e.g. ``cannot listen on 127.0.0.1:8080
    (--port): address already in use; stop what listens there or give another --port (0 picks a free
    one)``. ``port_option`` and ``host_option`` are the options that set the address."""
    kind, reason = bind_failure(error)
    option = port_option
    if kind == "in use":
        fix = f"stop what listens there or give another {port_option} (0 picks a free one)"
    elif kind == "permission":
        fix = f"give a {port_option} of 1024 or above, or run with the right to bind it"
    else:
        option, fix = host_option, f"give an address of this machine as {host_option} (127.0.0.1: this machine only)"
    return f"cannot listen on {host}:{port} ({option}): {reason}; {fix}"


def cannot_serve(host: str, port: int, error: OSError) -> str:
    """The line for ``error`` raised starting ``egress receiver``: its ``--record`` file (an error
    with a file name) or its address (:func:`cannot_listen`)."""
    if error.filename is not None:
        return f"cannot append to {error.filename} (--record): {error.strerror}; give another file"
    return cannot_listen(host, port, error, port_option="--port")


def unusable_state_dir(directory: Path) -> str | None:
    """Why ``directory`` cannot be a state directory (a path that exists and is not a directory), or
    ``None``: a missing directory is created by the run."""
    if directory.exists() and not directory.is_dir():
        return (f"--state-dir {directory}: not a directory; give --state-dir a directory (created when "
                "missing), e.g. the default .egress/<pipeline>")
    return None


def file_to_write(value: Path | None) -> Path | None:
    """The callback of an option naming a file a command writes (``--report``): checked before the
    command does anything, so that a run does not end in a traceback after its work. Raises
    ``typer.BadParameter`` (exit 2) for a directory or a path in a folder that does not exist."""
    if value is None:
        return None
    if value.is_dir():
        raise typer.BadParameter(f"{value} is a directory: give the path of a file to write")
    if not value.parent.is_dir():
        raise typer.BadParameter(f"folder {value.parent} does not exist: create it, or give a file in an existing "
                                 "folder")
    return value


def file_to_append(value: Path | None) -> Path | None:
    """The callback of an option naming a file a command appends to, creating its folders
    (``egress receiver --record``): only a directory is refused (``typer.BadParameter``, exit 2)."""
    if value is not None and value.is_dir():
        raise typer.BadParameter(f"{value} is a directory: give the path of a file to append to")
    return value
