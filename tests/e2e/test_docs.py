"""The docs test: every snippet of README.md, docs/*.md and examples/*/README.md a user copies, run
as written.

Each fenced block in the languages a user copies (``sh``, ``python``, ``yaml``, ``yson``, ``json``
Specs) carries an HTML comment on the line before its fence, which GitHub does not render:

* ``<!-- runnable -->`` or ``<!-- runnable: OPTION; OPTION ... -->``: this test runs it;
* ``<!-- not runnable: REASON -->``: it cannot run here, for REASON (a placeholder, hours of work,
  the test suite itself); the reason is for the reader too.

A block of those languages with neither fails :func:`test_every_snippet_says_whether_it_runs`;
blocks of other languages (output, diagrams: a bare fence or ``text``) are not snippets.

How a runnable block runs, each in a fresh temporary copy of the repository as the current
directory (``examples/`` copied; ``data/`` linked to this checkout's, ``.venv`` to this environment;
``PYTHONPATH`` this checkout's ``src``):

* ``sh``: ``bash -e -o pipefail``, in a process group of its own: it must exit 0, and whatever it
  left running in the background (``egress receiver … &``) is stopped afterwards, by that group's id;
* ``python``: ``python BLOCK.py`` (must exit 0); with the option ``pytest``, the block is a test
  module run by pytest (every test in it must pass);
* ``yaml`` / ``yson`` / ``json``: a Spec (it has ``pipeline``) written into the copy and loaded
  with ``egress.runtime.load_plan``, i.e. validated as ``egress validate`` does; a fragment
  (``into FILE at PATH``) merged into FILE of the copy at PATH first; a DynamicSpec fragment
  (``dynamic``) validated as a DynamicSpec with its throttlers.

Options:

* ``receiver PORT``: the test starts ``egress receiver`` first, for the block's ``PORT``;
* ``nats PORT``: the test starts a nats-server with JetStream (``.venv/bin/nats-server``) first;
* ``ports PORT …``: ports the block's own servers listen on;
* ``sample N``: the copy's ``*.csv.gz`` inputs are cut to their first N records (a whole pipeline
  in seconds instead of minutes);
* ``in DIR``: a Spec is written into DIR of the copy (its relative paths start there; default the
  copy's root);
* ``into FILE at PATH``: a fragment is merged into FILE (``/``-separated PATH; ``at`` omitted: the
  top) before the whole is validated;
* ``dynamic``: a DynamicSpec fragment;
* ``name NAME`` / ``uses NAME``: a block that ``uses`` another of the same file runs after it, as one
  program (a test of a class another block defines).

Every port named (``receiver``, ``nats``, ``ports``) is replaced, in the block and in the copy's
``examples/``, by a free port the test picks, so that runs beside other tests never collide; the
secrets a Spec names by environment variable (``env: NAME``, ``…_env: NAME``) are set to a test value.
A block that fails fails its test case, which is named by the file and the line of its fence, with
the block's output.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from egress.errors import SpecError
from egress.runtime import load_plan
from egress.spec import DynamicSpec, load_document, validate_model
from egress.throttler import validate_dynamic_throttlers
from tests.conftest import REPO
from tests.e2e.conftest import launch_receiver, stop_receiver
from tests.nats_server import NatsServer, free_port

pytestmark = pytest.mark.e2e
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "examples").glob("*/README.md"))]
SNIPPET_LANGUAGES = {"sh", "bash", "python", "yaml", "yson", "json"}
SPEC_LANGUAGES = {"yaml": ".yaml", "yson": ".yson", "json": ".json"}
BLOCK_TIMEOUT = 180.0  # seconds one block may take on a loaded machine (a failure guard only)
STOP_TIMEOUT = 10.0  # seconds a block's background processes get to exit on SIGTERM
TEXT_SUFFIXES = {".yaml", ".yml", ".yson", ".json", ".py", ".md"}
SECRET_VALUE = "docs-test-secret"

OPTIONS = {"receiver", "nats", "ports", "sample", "in", "into", "dynamic", "name", "uses", "pytest"}
COMMAND = re.compile(r"\s*(\.venv/bin/|make |curl |export |[A-Z_]+=\S* "
                     r"|egress (run|validate|receiver|redrive|throttler|state|status) )")
MARKER = re.compile(r"^\s*<!--\s*(runnable|not runnable)\s*(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")


@dataclass
class Block:
    """One fenced block: ``file`` (relative to the repository), ``line`` (its opening fence, 1-based),
    ``language``, ``text``, and the marker before it (``None``: none; ``"runnable"`` or
    ``"not runnable"``) with its ``options`` (option name → its words) or its ``reason``."""

    file: str
    line: int
    language: str
    text: str
    marker: str | None = None
    options: dict[str, list[str]] = field(default_factory=dict)
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def parse_options(text: str) -> dict[str, list[str]]:
    """``"nats 4222; sample 500"`` → ``{"nats": ["4222"], "sample": ["500"]}``."""
    options: dict[str, list[str]] = {}
    for part in filter(None, (piece.strip() for piece in text.split(";"))):
        name, *words = part.split()
        options[name] = words
    return options


def blocks_of(path: Path) -> Iterator[Block]:
    """The fenced blocks of the Markdown file ``path``, each with the marker on the line before it."""
    lines = path.read_text().split("\n")
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening.group(1), opening.group(2)
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = "\n".join(line.removeprefix(indent) for line in lines[index + 1:end]) + "\n"
        block = Block(str(path.relative_to(REPO)), index + 1, opening.group(3).lower(), body)
        marker = MARKER.match(lines[index - 1]) if index > 0 else None
        if marker is not None:
            block.marker = marker.group(1)
            if block.marker == "runnable":
                block.options = parse_options(marker.group(2) or "")
            else:
                block.reason = marker.group(2) or ""
        yield block
        index = end + 1


ALL_BLOCKS = [block for document in DOCUMENTS for block in blocks_of(document)]
RUNNABLE = [block for block in ALL_BLOCKS if block.marker == "runnable"]


def test_every_snippet_says_whether_it_runs() -> None:
    unmarked = [f"{b.where} (```{b.language})" for b in ALL_BLOCKS if b.language in SNIPPET_LANGUAGES
                and (b.marker is None or (b.marker == "not runnable" and not b.reason))]
    assert not unmarked, ("these snippets carry neither <!-- runnable --> nor <!-- not runnable: REASON --> on "
                          "the line before their fence (tests/e2e/test_docs.py says how):\n" + "\n".join(unmarked))


def test_commands_are_in_sh_blocks() -> None:
    """A command in a bare fence would escape the check above: it must be a ```sh block."""
    bare = [b.where for b in ALL_BLOCKS if b.language in ("", "text") and COMMAND.match(b.text)]
    assert not bare, "these blocks hold commands but are not ```sh blocks:\n" + "\n".join(bare)


def test_every_marker_option_is_known() -> None:
    unknown = [f"{b.where}: {name}" for b in RUNNABLE for name in b.options if name not in OPTIONS]
    assert not unknown, f"unknown options of <!-- runnable: ... --> (known: {', '.join(sorted(OPTIONS))}):\n" + \
        "\n".join(unknown)


def test_the_docs_have_runnable_snippets() -> None:
    """Guards the extraction itself: a broken marker pattern would make every run below vacuous."""
    assert {b.language for b in RUNNABLE} >= {"sh", "python", "yaml"}
    assert any(b.file == "README.md" for b in RUNNABLE)


def test_a_runnable_spec_block_has_a_pipeline_name_of_its_own() -> None:
    """A user who runs a documented Spec after an example's gets the default state directory
    ``.egress/<pipeline>``: one name for two layouts would refuse the second run."""
    examples = {}
    for path in sorted((REPO / "examples").rglob("*.yaml")):
        document = yaml.safe_load(path.read_text())
        if isinstance(document, dict) and "pipeline" in document:
            examples[document["pipeline"]] = str(path.relative_to(REPO))
    shared = []
    for block in RUNNABLE:
        if block.language != "yaml" or "into" in block.options:
            continue
        document = yaml.safe_load(block.text)
        name = document.get("pipeline") if isinstance(document, dict) else None
        if name in examples:
            shared.append(f"{block.where}: pipeline {name} is also {examples[name]}'s")
    assert not shared, "\n".join(shared)


def state_of(block: Block) -> set[str]:
    """The state folders the ``sh`` block's commands keep between runs: each nats-server's store
    (``-sd DIR``) and each embedded ``egress run``'s state directory (``--state-dir DIR``, else
    ``.egress/<pipeline>`` of its Spec); a cluster worker's committed state is its server's."""
    found: set[str] = set()
    for line in block.text.replace("\\\n", " ").splitlines():
        words = line.split("#")[0].split()
        if "-sd" in words[:-1] and any(w.endswith("nats-server") for w in words):
            found.add(words[words.index("-sd") + 1])
        if "run" not in words or not any(w.endswith("egress") for w in words[:words.index("run")]):
            continue
        after = words[words.index("run") + 1:]
        if any(w.startswith("nats://") for w in after) or not after:
            continue
        if "--state-dir" in after[:-1]:
            found.add(after[after.index("--state-dir") + 1])
        elif (REPO / after[0]).is_file():
            found.add(f".egress/{load_document(REPO / after[0])['pipeline']}")
    return found


def test_runnable_blocks_keep_their_state_apart() -> None:
    """A user runs one block after another in one checkout, where each runs in a copy of its own here:
    two blocks on one state (a NATS store, a state directory) would leave the second one nothing to
    send ("already holds everything")."""
    holders: dict[str, list[str]] = {}
    for block in RUNNABLE:
        if block.language in ("sh", "bash"):
            for state in state_of(block):
                holders.setdefault(state, []).append(block.where)
    assert any("nats" in state for state in holders), "the extraction found no NATS store"
    shared = [f"{state}: {', '.join(wheres)}" for state, wheres in sorted(holders.items()) if len(wheres) > 1]
    assert not shared, "these runnable blocks share a state: give each its own (-sd DIR, --state-dir, a " \
        "pipeline name)\n" + "\n".join(shared)


# -- the copy of the repository a block runs in -------------------------------------------------------


def make_copy(root: Path, block: Block) -> None:
    """``root`` as the repository a user has: ``examples/`` copied, ``data/`` linked (or sampled),
    ``.venv`` a link to this environment."""
    shutil.copytree(REPO / "examples", root / "examples",
                    ignore=shutil.ignore_patterns("__pycache__", ".egress", "*.pyc"))
    (root / ".venv").symlink_to(Path(sys.prefix))
    sample = block.options.get("sample")
    if sample is None:
        (root / "data").symlink_to(REPO / "data")
        return
    (root / "data").mkdir()
    for source in [*(REPO / "data").glob("*.csv.gz"), *(REPO / "examples").glob("*/data/*.csv.gz")]:
        target = root / source.relative_to(REPO)
        target.unlink(missing_ok=True)
        cut_records(source, target, int(sample[0]))


def cut_records(source: Path, target: Path, records: int) -> None:
    """Write the header and the first ``records`` lines of the gzip'd CSV ``source`` to ``target``."""
    with gzip.open(source, "rt", newline="") as reading, gzip.open(target, "wt", newline="", compresslevel=1) as out:
        for _, line in zip(range(records + 1), reading, strict=False):
            out.write(line)


def replace_ports(root: Path, text: str, ports: dict[int, int]) -> str:
    """``text`` and the copy's text files under ``examples/`` with each port ``a`` of ``ports`` as ``b``."""
    if not ports:
        return text
    pattern = re.compile(r"(?<!\d)(" + "|".join(str(p) for p in ports) + r")(?!\d)")

    def swap(found: re.Match[str]) -> str:
        return str(ports[int(found.group(1))])

    for path in (root / "examples").rglob("*"):
        if path.suffix in TEXT_SUFFIXES and path.is_file():
            original = path.read_text()
            changed = pattern.sub(swap, original)
            if changed != original:
                path.write_text(changed)
    return pattern.sub(swap, text)


def secrets_named(text: str) -> dict[str, str]:
    """A test value for every environment variable the text names as a secret's source."""
    names = re.findall(r"(?:\benv|_env)\s*:\s*([A-Za-z_][A-Za-z0-9_]*)", text)
    return dict.fromkeys(names, SECRET_VALUE)


def block_environment(text: str) -> dict[str, str]:
    source = str(REPO / "src")
    inherited = os.environ.get("PYTHONPATH")
    return {**os.environ, **secrets_named(text), "PYTHONPATH": source if not inherited else f"{source}:{inherited}"}


class Servers:
    """The servers a block's options ask the test to start (:meth:`start`, :meth:`stop`), and the
    block's port mapping (:attr:`ports`: the port it names → the port it gets)."""

    def __init__(self) -> None:
        self.ports: dict[int, int] = {}
        self.stops: list[Any] = []

    def start(self, root: Path, block: Block) -> None:
        self.ports.update((int(p), free_port()) for p in block.options.get("ports", []))
        for port in block.options.get("receiver", []):
            receiver = launch_receiver(root / f"received-{port}.jsonl")
            self.stops.append(lambda receiver=receiver: stop_receiver(receiver))
            self.ports[int(port)] = receiver.port
        for port in block.options.get("nats", []):
            server = NatsServer().start()
            self.stops.append(server.stop)
            self.ports[int(port)] = server.port

    def stop(self) -> None:
        for stop in reversed(self.stops):
            stop()


@pytest.fixture
def copy_root(tmp_path: Path) -> Path:
    root = tmp_path / "repository"
    root.mkdir()
    return root


# -- running a block --------------------------------------------------------------------------------


def program_of(block: Block) -> str:
    """The block's text, after the text of the blocks it ``uses`` (in their order)."""
    used = block.options.get("uses", [])
    named = {b.options["name"][0]: b for b in RUNNABLE if b.file == block.file and "name" in b.options}
    missing = [name for name in used if name not in named]
    assert not missing, f"{block.where}: `uses {' '.join(missing)}`: no block of {block.file} has that name"
    return "".join(named[name].text + "\n" for name in used) + block.text


def stop_group(group: int) -> None:
    """Stop what a block left running in process group ``group`` (SIGTERM, then SIGKILL)."""
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        return


def run_program(block: Block, root: Path, command: list[str], env: dict[str, str]) -> None:
    """Run ``command`` in ``root`` in a process group of its own; fail naming the block unless it exits 0."""
    output = root.parent / "output.txt"
    with output.open("wb") as sink:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = process.wait(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop_group(process.pid)
            process.wait()
    if code != 0:
        ending = f"did not end within {BLOCK_TIMEOUT:g} s" if code is None else f"exited {code}"
        pytest.fail(f"{block.where}: the ```{block.language} block {ending}:\n{block.text}\n--- its output:\n"
                    f"{output.read_text(errors='replace')[-6000:]}", pytrace=False)


def run_code(block: Block, root: Path, text: str) -> None:
    env = block_environment(text)
    if block.language == "python":
        name = "test_snippet.py" if "pytest" in block.options else "snippet.py"
        (root / name).write_text(text)
        command = ([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto", name]
                   if "pytest" in block.options else [sys.executable, name])
    else:
        (root / "snippet.sh").write_text(text)
        command = ["bash", "-e", "-o", "pipefail", "snippet.sh"]
    run_program(block, root, command, env)


def merged(document: Any, path: str, fragment: Any) -> Any:
    """``document`` with the mapping ``fragment`` merged in at ``path`` (``/``-separated), key by key."""
    target = document
    for key in filter(None, path.split("/")):
        target = target.setdefault(key, {})
    deep_merge(target, fragment)
    return document


def deep_merge(target: dict[str, Any], fragment: dict[str, Any]) -> None:
    for key, value in fragment.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            deep_merge(target[key], value)
        else:
            target[key] = value


def check_spec(block: Block, root: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Load the Spec block (or the fragment merged into its file) as ``egress validate`` does."""
    monkeypatch.chdir(root)
    for name, value in secrets_named(text).items():
        monkeypatch.setenv(name, value)
    suffix = SPEC_LANGUAGES[block.language]
    folder = root / block.options.get("in", ["."])[0]
    written = folder / f"docs-snippet{suffix}"
    into = block.options.get("into")
    problem = None
    try:
        if into is not None:
            target = root / into[0]
            fragment = load_document_text(text, suffix, root)
            document = merged(load_document(target), into[2] if len(into) > 2 else "", fragment)
            written = target.with_name(f"docs-snippet{target.suffix}")
            written.write_text(yaml.safe_dump(document, sort_keys=False))
            load_plan(written, dynamic_spec_beside(target))
        elif "dynamic" in block.options:
            written.write_text(text)
            validate_dynamic_throttlers(validate_model(DynamicSpec, load_document(written), file=str(written)),
                                        file=str(written))
        else:
            written.write_text(text)
            load_plan(written)
    except SpecError as error:
        problem = error.format()
    if problem is not None:
        pytest.fail(f"{block.where}: the ```{block.language} block does not load:\n{problem}", pytrace=False)


def load_document_text(text: str, suffix: str, root: Path) -> Any:
    scratch = root / f"docs-fragment{suffix}"
    scratch.write_text(text)
    return load_document(scratch)


def dynamic_spec_beside(spec: Path) -> Path | None:
    """The DynamicSpec of an example Spec (``dynamic_spec.yaml`` in its folder), if it has one."""
    beside = spec.with_name("dynamic_spec.yaml")
    return beside if beside.exists() else None


@pytest.mark.timeout(BLOCK_TIMEOUT + 60)
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_snippet_runs_as_written(block: Block, copy_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_copy(copy_root, block)
    servers = Servers()
    try:
        servers.start(copy_root, block)
        text = replace_ports(copy_root, program_of(block), servers.ports)
        if block.language in SPEC_LANGUAGES:
            check_spec(block, copy_root, text, monkeypatch)
        else:
            run_code(block, copy_root, text)
    finally:
        servers.stop()
