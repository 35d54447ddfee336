"""The NATS engine's subject tokens, and that embedded runs never import nats-py."""

from __future__ import annotations

import re
import subprocess
import sys

from egress.engines.nats.subjects import Layout, default_bucket, key_token, name_of_token, name_token

KV_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")  # nats-py's (and the server's) KV key alphabet


def test_plain_names_stay_readable_and_others_are_encoded_without_collisions() -> None:
    names = ["deliver", "source:events", "=deliver", "a.b", "", "é", "x" * 65, "requests"]
    tokens = [name_token(name) for name in names]
    assert tokens[0] == "deliver"
    assert tokens[7] == "requests"
    assert len(set(tokens)) == len(names)
    assert all(KV_KEY.fullmatch(token) and "." not in token for token in tokens)


def test_keys_become_single_tokens_of_the_kv_alphabet_even_when_long() -> None:
    keys = [b'["a"]', b"", b"[\"\\u00e9.*>\"]", b"x" * 96, b"x" * 97, b"y" * 10_000]
    tokens = [key_token(key) for key in keys]
    assert len(set(tokens)) == len(keys)
    assert all(KV_KEY.fullmatch(token) and "." not in token and len(token) <= 129 for token in tokens)


def test_every_subject_of_a_layout_is_a_kv_key_of_its_bucket() -> None:
    layout = Layout(default_bucket("my pipeline"))
    subjects = [layout.lease("source:s", 0), layout.checkpoint("c", 1), layout.log_chunk("events", 2, 4096),
                layout.outbox_chunk("c", 1, 7), layout.state("c", 1, 7, "counts", b'["k"]'),
                layout.external("profiles", b'["k"]'), layout.timer("c", 1, 7, b'["k"]', 1.5, "event"),
                layout.redo("c", 1, 0), layout.member("worker 7")]
    assert all(s.startswith(layout.prefix) and KV_KEY.fullmatch(layout.suffix(s)) for s in subjects)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", layout.bucket)


def test_append_notes_go_to_a_subject_of_the_bucket_outside_its_stream() -> None:
    layout = Layout("b")
    assert layout.appends == "egress.appends.b"
    assert not layout.appends.startswith(layout.prefix)
    assert layout.appends != Layout("c").appends


def test_a_name_and_a_partition_read_back_from_the_subjects_naming_them() -> None:
    names = ["deliver", "source:events", "=deliver", "a.b", "", "\u00e9", "x" * 65]
    assert [name_of_token(name_token(name)) for name in names] == names
    layout = Layout("b")
    subjects = [layout.lease("source:s", 3), layout.checkpoint("a.b", 3), layout.log_chunk("é", 3, 4096),
                layout.outbox_chunk("c", 3, 7), layout.timer("c", 3, 7, b'["k"]', 1.5, "event"), layout.redo("c", 3, 0),
                layout.state("c", 3, 7, "counts", b'["k"]')]
    assert [layout.owner_of(subject) for subject in subjects] == [
        ("source:s", 3), ("a.b", 3), ("é", 3), ("c", 3), ("c", 3), ("c", 3), ("c", 3)]


def test_a_state_or_timer_subject_names_its_generation_and_moves_to_another() -> None:
    layout = Layout("b")
    for subject in (layout.state("a.b", 3, 7, "counts", b'["k"]'), layout.timer("a.b", 3, 7, b'["k"]', 1.5, "event")):
        assert layout.generation_of(subject) == 7
        moved = layout.in_generation(subject, 12)
        assert layout.generation_of(moved) == 12
        assert layout.owner_of(moved) == ("a.b", 3)
        assert moved.replace(".12.", ".7.", 1) == subject


def test_importing_egress_and_its_engines_does_not_import_nats() -> None:
    code = "import sys, egress, egress.engines, egress.runtime; print(sorted({'nats', 'msgpack'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
