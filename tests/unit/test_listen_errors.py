"""egress.listen_errors.bind_failure: a bind's OSError classified once for every part that listens."""

from __future__ import annotations

import errno
import socket

import pytest

from egress.listen_errors import BindFailure, bind_failure


def test_a_port_another_socket_holds_is_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with socket.socket() as second, pytest.raises(OSError, match="in use") as raised:
            second.bind(taken.getsockname())
    assert bind_failure(raised.value) == BindFailure("in use", "address already in use")


def test_an_address_not_of_this_machine_is_an_address_failure_with_the_systems_words() -> None:
    with socket.socket() as probe, pytest.raises(OSError, match="assign") as raised:
        probe.bind(("192.0.2.1", 0))  # TEST-NET-1: never an address of this machine
    assert bind_failure(raised.value) == BindFailure("address", "cannot assign requested address")


def test_asyncios_repeated_address_is_taken_off_the_reason() -> None:
    error = OSError(errno.EACCES, "error while attempting to bind on address ('0.0.0.0', 80): permission denied")
    assert bind_failure(error) == BindFailure("permission", "permission denied")
