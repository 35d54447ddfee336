"""The chaos harness's own rules (``benchmarks/chaos.py``): its schedule depends on the seed alone,
its proxy names the process that sent a request, and its audit explains a duplicate only by a
causal condition on the process a fault hit, never by a fault that merely happened in between."""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys

import pytest
from benchmarks.chaos import (
    FLIGHTS_KILL,
    OUTAGE_KINDS,
    Attempt,
    Change,
    Evidence,
    Kill,
    Schedule,
    Stop,
    duplicate_cause,
    socket_owners,
)

KEY = "00" * 22


def test_a_seed_gives_one_schedule_and_every_outage_is_followed_by_a_flights_kill_inside_it() -> None:
    first, second = Schedule(7, cluster=True), Schedule(7, cluster=True)
    faults = [first.next() for _ in range(300)]
    assert faults == [second.next() for _ in range(300)]
    assert faults != [Schedule(8, cluster=True).next() for _ in range(300)]
    assert {fault.kind for fault in faults} >= {"worker_kill", "nats_restart", "egress_stop", "stall"}
    for outage, following in itertools.pairwise(faults):
        if outage.kind in OUTAGE_KINDS:
            assert following.kind == FLIGHTS_KILL
            assert 0.2 * outage.seconds <= following.gap <= outage.seconds + 1.5


def test_the_proxy_names_the_process_holding_the_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        client = subprocess.Popen(
            [sys.executable, "-c", f"import socket,sys; s=socket.create_connection(('127.0.0.1',{port})); "
             "print('connected', flush=True); sys.stdin.read()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert client.stdout is not None
            assert client.stdout.readline() == "connected\n"
            connection, (_, peer) = server.accept()
            with connection:
                assert socket_owners(port, {client.pid: "w1/0", 1: "init"}) == {peer: "w1/0"}
                assert socket_owners(port, {1: "init"}) == {}  # not a process of the harness
        finally:
            assert client.stdin is not None
            client.stdin.close()
            client.wait(10)


def attempt(sender: str, started: float, answered: float, outcome: str = "passed") -> Attempt:
    return Attempt(outcome, sender, started, answered, answered - started)


def no_evidence() -> Evidence:
    return Evidence([], [], [], [])


def test_a_stop_between_two_deliveries_explains_nothing_unless_the_key_was_in_flight_in_the_stopped_run() -> None:
    first, again = attempt("flights/0", 10.0, 10.1), attempt("flights/0", 20.0, 20.1)
    evidence = no_evidence()
    evidence.stops.append(Stop("flights/0", 15.0, 16.0))  # between the deliveries, the key answered before
    assert duplicate_cause(KEY, 0, first, again, [first, again], evidence) == "unexplained"
    in_flight = attempt("flights/0", 14.9, 15.5)  # arrived before the stop, answered while frozen
    assert duplicate_cause(KEY, 0, first, again, [first, in_flight, again], evidence) == "stop"
    by_another = attempt("flights/1", 20.0, 20.1)  # sent again by a run that was not stopped
    assert duplicate_cause(KEY, 0, first, by_another, [first, in_flight, by_another], evidence) == "unexplained"


def test_a_kill_explains_only_a_key_left_in_the_killed_runs_committed_unacknowledged_outbox() -> None:
    first, again = attempt("flights/0", 10.0, 10.1), attempt("flights/1", 20.0, 20.1)
    evidence = no_evidence()
    evidence.kills.append(Kill(15.0, "flights/0", {"other"}))
    assert duplicate_cause(KEY, 0, first, again, [first, again], evidence) == "unexplained"
    evidence.kills.append(Kill(15.0, "flights/0", {KEY}))
    assert duplicate_cause(KEY, 0, first, again, [first, again], evidence) == "kill"
    # a request of the killed run that reached the proxy only after its death
    late = attempt("flights/0", 15.2, 15.3)
    assert duplicate_cause(KEY, 0, late, again, [late, again], evidence) == "kill"
    before_kill = attempt("flights/1", 21.0, 21.1)
    assert duplicate_cause(KEY, 0, again, before_kill, [again, before_kill], evidence) == "unexplained"


@pytest.mark.parametrize(("keys", "restarts", "cause"), [
    (frozenset(), [], "unexplained"),  # changed hands, but the key was acknowledged: re-sending it is a bug
    (frozenset({KEY}), [], "handover"),
    (frozenset({KEY}), [(14.0, 14.5)], "nats"),
])
def test_a_change_of_hands_explains_a_key_committed_and_unacknowledged_at_the_change(
        keys: frozenset[str], restarts: list[tuple[float, float]], cause: str) -> None:
    first, again = attempt("w1/0", 10.0, 10.1), attempt("w2/0", 20.0, 20.1)
    evidence = Evidence([], [], [Change(15.0, 15.05, 3, keys)], restarts)
    assert duplicate_cause(KEY, 3, first, again, [first, again], evidence) == cause
    assert duplicate_cause(KEY, 2, first, again, [first, again], evidence) == "unexplained"  # another partition


def test_a_lost_answer_and_a_slow_attempt_explain_a_duplicate_and_a_record_without_an_attempt_does_not() -> None:
    again = attempt("flights/0", 20.0, 20.1)
    assert duplicate_cause(KEY, 0, attempt("flights/0", 10.0, 10.1, "reset_response"), again, [], no_evidence()) \
        == "network"
    assert duplicate_cause(KEY, 0, attempt("flights/0", 10.0, 12.5), again, [], no_evidence()) == "timeout"
    assert duplicate_cause(KEY, 0, None, again, [], no_evidence()).startswith("unexplained")
