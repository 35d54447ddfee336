"""The pure parts of the NATS engine's leases, members and append notes: records and TTL headers."""

from __future__ import annotations

import json

import pytest

from egress.engines import LeaseInfo, MemberInfo
from egress.engines.nats import records
from egress.engines.nats.jetstream import ttl_headers


def test_a_ttl_becomes_whole_seconds_rounded_up_and_at_least_one() -> None:
    assert [ttl_headers(ttl)["Nats-TTL"] for ttl in (10.0, 2.5, 0.2, 1.0)] == ["10s", "3s", "1s", "1s"]


def test_an_appends_note_reads_back_its_sender_and_slots() -> None:
    note = records.appends_note("instance-1", [("out", 3), ("é", 0)])
    assert records.appends_note_slots(note) == ("instance-1", {("out", 3), ("é", 0)})


def test_an_appends_note_reads_back_the_log_chunks_it_names_and_a_note_of_slots_only_names_none() -> None:
    note = records.appends_note("instance-1", [("out", 3)], [("out", 3, 4096, 1000, 77)])
    assert records.appends_note_chunks(note) == [("out", 3, 4096, 1000, 77)]
    assert records.appends_note_slots(note) == ("instance-1", {("out", 3)})
    slots_only = records.pack(["instance-1", [["out", 3]]])
    assert records.appends_note_chunks(slots_only) == []
    assert records.appends_note_slots(slots_only) == ("instance-1", {("out", 3)})


def test_an_appends_note_carries_the_payloads_given_and_a_note_without_them_reads_none() -> None:
    chunks = [("out", 3, 0, 2, 77), ("out", 1, 5, 1, 78)]
    note = records.appends_note("instance-1", [("out", 3), ("out", 1)], chunks, [b"chunk-77", None])
    assert records.read_appends_note(note) == ("instance-1", {("out", 3), ("out", 1)},
                                               [(chunks[0], b"chunk-77"), (chunks[1], None)])
    named = records.appends_note("instance-1", [("out", 3), ("out", 1)], chunks, [None, None])
    assert len(records.unpack(named)) == 3  # no payload carried: the note of names only
    assert records.read_appends_note(named)[2] == [(chunks[0], None), (chunks[1], None)]


def test_an_appends_note_whose_payloads_do_not_match_its_chunks_is_refused() -> None:
    with pytest.raises(ValueError, match="2 chunks given 1 payloads"):
        records.appends_note("i", [("out", 3)], [("out", 3, 0, 2, 77), ("out", 3, 2, 1, 78)], [b"x"])
    bad = records.pack(["i", [["out", 3]], [["out", 3, 0, 2, 77]], [b"x", b"y"]])
    with pytest.raises(ValueError, match="1 chunks carries 2 payloads"):
        records.read_appends_note(bad)


def test_a_lease_record_tells_its_owner_generation_and_expiry_and_one_of_acquire_has_neither_owner_nor_expiry() -> None:
    leased = json.dumps({"consumer": "c", "partition": 1, "owner": "h:1", "worker": "w1", "expires_at": 110.0,
                         "epoch": 5}).encode()  # the stored key of the generation
    assert records.lease_info(leased, 9, 100.0) == LeaseInfo("c", 1, "w1", 5, 10.0)
    first = json.dumps({"consumer": "c", "partition": 1, "owner": "h:1", "worker": "w1",
                        "expires_at": 110.0}).encode()
    assert records.lease_info(first, 5, 111.0) == LeaseInfo("c", 1, "w1", 5, 0.0)  # lapsed, not removed yet
    acquired = json.dumps({"consumer": "c", "partition": 1, "owner": "h:1", "ttl": 30.0}).encode()
    assert records.lease_info(acquired, 7, 100.0) == LeaseInfo("c", 1, "", 7, None)


def test_a_member_record_reads_back_as_the_member() -> None:
    member = MemberInfo("w1", "ab12", {"host": "h", "pid": 7, "status_url": "http://127.0.0.1:1/status"})
    assert records.member_info(records.member_record(member)) == member
