"""``python -m tests.interrupted_exit ARGS...``: the ``egress`` program with ``ARGS``, interrupted
(SIGINT to itself) inside ``settle_for_exit``'s garbage collection, the last step of its exit, as
a Ctrl-C that lands there would be."""

from __future__ import annotations

import copy
import gc
import os
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from egress.cli import main as cli

SPEC = {
    "pipeline": "settle",
    "streams": {"events": {"schema": [{"name": "id", "type": "int64"}, {"name": "payload", "type": "string"}]},
                "requests": {"schema": [{"name": "payload", "type": "string"}]}},
    "sources": {"events_jsonl": {"source_class_name": "jsonl", "output_stream_id": "events",
                                 "parameters": {"path": "events.jsonl"}}},
    "computations": {"deliver": {"processing_function": "tests.pipelines:Passthrough",
                                 "input_stream_ids": ["events"], "output_stream_ids": ["requests"]}},
}
"""A pipeline with no sink (nothing to serve): one event in, passed through, committed."""


def write_spec(directory: Path, processing_function: str | None = None) -> Path:
    """Write :data:`SPEC` (its computation's ``processing_function`` replaced when given) and its
    one-event source file into ``directory``; returns the Spec's path."""
    (directory / "events.jsonl").write_text('{"id": 1, "payload": "a"}\n')
    spec = directory / "spec.yaml"
    document = copy.deepcopy(SPEC)
    if processing_function is not None:
        document["computations"]["deliver"]["processing_function"] = processing_function
    spec.write_text(yaml.safe_dump(document))
    return spec

settle = cli.settle_for_exit


def _interrupt(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        gc.callbacks.remove(_interrupt)
        os.kill(os.getpid(), signal.SIGINT)  # handled in this thread before the collection goes on


def _interrupted_settle() -> None:
    gc.callbacks.append(_interrupt)
    settle()


if __name__ == "__main__":
    cli.settle_for_exit = _interrupted_settle
    sys.argv = ["egress", *sys.argv[1:]]
    cli.main()
