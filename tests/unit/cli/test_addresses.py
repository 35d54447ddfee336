"""The errors of a command that cannot listen or use its state directory name the option and the fix."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

from typer.testing import CliRunner

from egress.cli.addresses import cannot_listen, cannot_serve, unusable_state_dir
from egress.cli.main import app
from egress.cli.throttler import throttler_app
from tests.conftest import payload_spec


def test_an_address_in_use_names_the_option_and_a_free_port_as_the_fix() -> None:
    # asyncio's wording: the address again in the reason
    error = OSError(errno.EADDRINUSE, "error while attempting to bind on address ('127.0.0.1', 8080): "
                                      "address already in use")
    assert cannot_listen("127.0.0.1", 8080, error, port_option="--http-port") == (
        "cannot listen on 127.0.0.1:8080 (--http-port): address already in use; stop what listens there or "
        "give another --http-port (0 picks a free one)")


def test_an_address_not_of_this_machine_names_the_host_option() -> None:
    error = OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
    line = cannot_listen("10.9.9.9", 80, error, port_option="--port", host_option="--host")
    assert line.startswith("cannot listen on 10.9.9.9:80 (--host): cannot assign requested address; ")
    assert "as --host" in line


def test_a_file_is_not_a_state_directory_and_a_missing_one_is_fine(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert unusable_state_dir(tmp_path / "missing") is None
    assert unusable_state_dir(tmp_path) is None
    assert unusable_state_dir(tmp_path / "file") == (
        f"--state-dir {tmp_path / 'file'}: not a directory; give --state-dir a directory (created when "
        "missing), e.g. the default .egress/<pipeline>")


def test_throttler_serve_on_a_port_in_use_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """Was a traceback: the bind error escaped ``asyncio.run``."""
    dynamic = tmp_path / "dynamic.yaml"
    dynamic.write_text("throttlers: {q: {limit: 10}}\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(throttler_app, ["serve", "--dynamic-spec", str(dynamic), "--port", str(port)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"cannot listen on 127.0.0.1:{port} (--port): address already in use" in result.output


def test_validate_and_run_refuse_a_file_as_state_directory_alike(tmp_path: Path) -> None:
    """``validate --state-dir FILE`` said "holds no committed state yet" (exit 0) while ``run`` failed
    with "File exists"."""
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a"])
    state = tmp_path / "not-a-directory"
    state.write_text("x")
    expected = f"--state-dir {state}: not a directory"
    for command in ("validate", "run"):
        result = CliRunner().invoke(app, [command, str(spec), "--state-dir", str(state)],
                                    env={"COLUMNS": "250"})
        assert result.exit_code == 1, (command, result.output)
        assert expected in result.output, command
    assert state.read_text() == "x"


def test_a_report_that_cannot_be_written_is_refused_before_the_run(tmp_path: Path) -> None:
    """Was a traceback at the end of the run, after all its work (FileNotFoundError, IsADirectoryError)."""
    spec, _ = payload_spec(tmp_path, "http://127.0.0.1:9/events", ["a"])
    for report, expected in ((tmp_path / "missing" / "report.json", f"folder {tmp_path / 'missing'} does not exist"),
                             (tmp_path, f"{tmp_path} is a directory")):
        result = CliRunner().invoke(app, ["run", str(spec), "--state-dir", str(tmp_path / "state"), "--report",
                                          str(report)], env={"COLUMNS": "250"})
        assert result.exit_code == 2, result.output
        assert expected in result.output
        assert not (tmp_path / "state").exists()  # nothing ran


def test_a_record_file_that_is_a_directory_is_refused_not_called_an_address_problem(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["receiver", "--port", "0", "--record", str(tmp_path)], env={"COLUMNS": "250"})
    assert result.exit_code == 2, result.output
    assert f"{tmp_path} is a directory: give the path of a file to append to" in result.output


def test_a_record_file_that_cannot_be_opened_is_named_as_the_record_file() -> None:
    error = PermissionError(errno.EACCES, "Permission denied", "/var/log/received.jsonl")
    assert cannot_serve("127.0.0.1", 8080, error) == (
        "cannot append to /var/log/received.jsonl (--record): Permission denied; give another file")
    in_use = OSError(errno.EADDRINUSE, "address already in use")
    assert cannot_serve("127.0.0.1", 8080, in_use).startswith("cannot listen on 127.0.0.1:8080 (--port): ")
