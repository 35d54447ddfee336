"""Hostile Spec and DynamicSpec files, fuzzed with hypothesis through the CLI (typer's CliRunner,
in process): random documents in YAML, JSON and YSON, random bytes, and mutations of every
example's Spec and DynamicSpec (a value replaced, a key dropped or added, the text cut or
flipped). ``egress validate`` and ``egress run`` never raise: each problem is one line naming the
file, and the exit code is 2 (or 0 for a mutation that is still a valid Spec)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
import yt.yson
from hypothesis import example, given
from hypothesis import strategies as st
from typer.testing import Result

from egress.errors import printable
from tests.conftest import REPO
from tests.fuzzing import fuzz, invoke

EXAMPLES = [
    (REPO / "examples" / "http_delivery" / "spec.yaml", REPO / "examples" / "http_delivery" / "dynamic_spec.yaml"),
    (REPO / "examples" / "firehose_delivery" / "spec.yaml",
     REPO / "examples" / "firehose_delivery" / "dynamic_spec.yaml"),
    (REPO / "examples" / "url_downloader" / "spec.yaml", REPO / "examples" / "url_downloader" / "dynamic_spec.yaml"),
    (REPO / "examples" / "retryable_async_request" / "spec.yaml", None),
    (REPO / "examples" / "live_inputs" / "webhook_spec.yaml", None),
]
ENV = {"FIREHOSE_ACCESS_KEY": "fuzz-key"}
FORMATS = (".yaml", ".json", ".yson")

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
           | st.text(max_size=20) | st.sampled_from(["", "10s", "1m", "nats://", "http://h:99999/", "%true", "~"]))
documents = st.recursive(scalars, lambda children: st.lists(children, max_size=4)
                         | st.dictionaries(st.text(max_size=12), children, max_size=5), max_leaves=20)


def _absolute(document: dict[str, Any], base: Path) -> dict[str, Any]:
    """``document`` with its sources' relative ``path`` parameters made absolute (the mutated copy is
    written elsewhere, and a missing file would hide every deeper check)."""
    for source in (document.get("sources") or {}).values():
        path = source.get("parameters", {}).get("path")
        if isinstance(path, str) and not Path(path).is_absolute():
            source["parameters"]["path"] = str(base / path)
    return document


def _loaded(path: Path | None) -> dict[str, Any]:
    return {} if path is None else _absolute(yaml.safe_load(path.read_text()), path.parent)


def dump(document: Any, suffix: str) -> bytes:
    """``document`` as a file of format ``suffix`` (values YSON cannot write become strings)."""
    if suffix == ".yaml":
        return yaml.safe_dump(document, allow_unicode=True).encode()
    if suffix == ".json":
        return json.dumps(document).encode()
    try:
        return bytes(yt.yson.dumps(document))
    except Exception:  # an integer beyond YSON's 64 bits, a key YSON cannot write: write its JSON text
        return bytes(yt.yson.dumps(json.dumps(document)))


@contextmanager
def files() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="egress-spec-fuzz-") as directory:
        yield Path(directory)


def check(result: Result, *names: Path, allow_valid: bool = False) -> None:
    """No traceback, exit 2 (0 too when ``allow_valid``), and every printed problem one line naming one of ``names``."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code in ((0, 2) if allow_valid else (2,)), result.output
    if result.exit_code == 2:
        lines = [line for line in result.output.split("\n") if line.strip()]
        assert lines, "exit 2 without a message"
        for line in lines:
            assert any(line.startswith(str(name)) for name in names), line
            assert printable(line) == line, f"a control character or line separator in {line!r}"
            assert "Traceback" not in line, result.output


def validate(spec: Path, dynamic: Path | None = None) -> Result:
    command = ["validate", str(spec)] + (["--dynamic-spec", str(dynamic)] if dynamic is not None else [])
    return invoke(command, env=ENV)


@fuzz(60)
@given(document=documents, suffix=st.sampled_from(FORMATS), as_dynamic=st.booleans())
@example(document={"pipeline": "p", "partition_count": True, "streams": {}}, suffix=".yaml", as_dynamic=False)
@example(document=[1, 2], suffix=".json", as_dynamic=True)
@example(document={"\x1e": None}, suffix=".yaml", as_dynamic=False)  # a record separator: used to split the line
@example(document={"pipeline": "p\x1b[2J", "streams": {"s\u2028": 5}}, suffix=".json", as_dynamic=False)
@example(document={"computations": {"c": {"sinks": {"s": {"parameters": 7}}}}}, suffix=".yson", as_dynamic=True)
def test_a_random_document_is_refused_in_one_line_per_problem(document: Any, suffix: str, as_dynamic: bool) -> None:
    with files() as directory:
        path = directory / f"document{suffix}"
        path.write_bytes(dump(document, suffix))
        if as_dynamic:
            spec = directory / "spec.yaml"
            spec.write_text(EXAMPLES[0][0].read_text().replace("data/", f"{EXAMPLES[0][0].parent}/data/"))
            check(validate(spec, path), spec, path, allow_valid=True)  # {} is a valid DynamicSpec
        else:
            check(validate(path), path)
            state = directory / "state"
            check(invoke(["run", str(path), "--state-dir", str(state)], env=ENV), path)
            assert not state.exists()


@fuzz(100)
@given(data=st.binary(max_size=300), suffix=st.sampled_from((*FORMATS, ".yml")))
@example(data=b"\xef\xbb\xbfpipeline: p\n", suffix=".yaml")
@example(data=b"\xff\xfe\x00\x00", suffix=".json")
@example(data=b"{\x00}", suffix=".yson")
@example(data=b"a: &x [*x]\n", suffix=".yaml")
@example(data=b"!!python/object:os.system {}\n", suffix=".yaml")
def test_random_bytes_are_refused_in_one_line(data: bytes, suffix: str) -> None:
    with files() as directory:
        path = directory / f"spec{suffix}"
        path.write_bytes(data)
        check(validate(path), path)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


def _mutate(document: Any, path: tuple[Any, ...], action: str, value: Any, key: str) -> Any:
    """``document`` with the node at ``path`` replaced by ``value``, dropped, or given the extra ``key``."""
    if not path:
        return value if action == "replace" else document
    parent = document
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "replace":
        parent[last] = value
    elif action == "drop":
        del parent[last]
    elif isinstance(parent[last], dict):
        parent[last][key] = value
    return document


@st.composite
def mutations(draw: st.DrawFn) -> tuple[int, bool, Any]:
    """An example (index), which of its files, and that file's document with one to three mutations."""
    index = draw(st.integers(0, len(EXAMPLES) - 1))
    spec, dynamic = EXAMPLES[index]
    mutate_dynamic = dynamic is not None and draw(st.booleans())
    document = _loaded(dynamic if mutate_dynamic else spec)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(document))
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "drop", "add"]))
        document = _mutate(document, path, action, draw(documents), draw(st.text(max_size=10)))
    return index, mutate_dynamic, document


@fuzz(80)
@given(mutation=mutations(), suffix=st.sampled_from(FORMATS))
@example(mutation=(0, False, {**_loaded(EXAMPLES[0][0]), "partition_count": "4"}), suffix=".yson")
@example(mutation=(0, True, {"computations": {"to_json": {"sinks": {"http": {"parameters": {
    "max_attempt_count": True}}}}}}), suffix=".json")
def test_a_mutated_example_spec_is_valid_or_refused_in_one_line_per_problem(
        mutation: tuple[int, bool, Any], suffix: str) -> None:
    index, mutate_dynamic, document = mutation
    spec, dynamic = EXAMPLES[index]
    with files() as directory:
        written = directory / f"mutated{suffix}"
        written.write_bytes(dump(document, suffix))
        if mutate_dynamic:
            base = directory / "spec.yaml"
            base.write_text(yaml.safe_dump(_loaded(spec)))
            check(validate(base, written), base, written, allow_valid=True)
        else:
            other = None
            if dynamic is not None:
                other = directory / "dynamic.yaml"
                other.write_text(dynamic.read_text())
            check(validate(written, other), written, *([other] if other else []), allow_valid=True)


@fuzz(50)
@given(index=st.integers(0, len(EXAMPLES) - 1), cut=st.integers(0, 10_000), flips=st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4))
def test_an_example_spec_cut_or_with_bytes_flipped_is_valid_or_refused_in_one_line(
        index: int, cut: int, flips: list[tuple[int, int]]) -> None:
    spec, _ = EXAMPLES[index]
    text = bytearray(yaml.safe_dump(_loaded(spec)).encode())
    for position, byte in flips:
        text[position % len(text)] = byte
    with files() as directory:
        path = directory / "spec.yaml"
        path.write_bytes(bytes(text[: len(text) - cut % len(text)]))
        check(validate(path), path, allow_valid=True)


@pytest.fixture(autouse=True)
def _no_examples_directory_pollution() -> Iterator[None]:
    before = set(os.listdir(REPO))
    yield
    assert set(os.listdir(REPO)) == before
