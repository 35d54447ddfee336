"""Time of loading the examples' YAML Specs and DynamicSpecs: PyYAML's ``yaml.safe_load`` (the
pure-Python parser) next to ``egress.spec.loader.parse_text`` (libyaml's ``CSafeLoader`` and the
duplicate-key walk), alternated A B A B in one run.

Each figure is the best of 5 rounds of 50 loads of every ``examples/**/*.yaml`` file (their bytes read
once), in milliseconds for all the files, by ``time.perf_counter``; the load average is printed
before and after. Run from the repository: ``PYTHONPATH=src .venv/bin/python benchmarks/yaml_load.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from egress.spec.loader import parse_text

REPO = Path(__file__).resolve().parent.parent


def best_ms(load: Callable[[bytes], object], documents: list[bytes], rounds: int = 5, loads: int = 50) -> float:
    """The fastest round's time of loading every document once, in milliseconds."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(loads):
            for document in documents:
                load(document)
        best = min(best, (time.perf_counter() - start) / loads)
    return best * 1e3


def main() -> None:
    files = sorted((REPO / "examples").rglob("*.yaml"))
    documents = [f.read_bytes() for f in files]
    print(f"load average {os.getloadavg()}")
    for _ in range(2):
        print(f"A yaml.safe_load: {best_ms(yaml.safe_load, documents):.2f} ms for {len(files)} files")
        print(f"B parse_text:     {best_ms(lambda d: parse_text(d, '.yaml'), documents):.2f} ms")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
