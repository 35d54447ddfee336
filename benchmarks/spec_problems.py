"""Time and peak memory of ``egress validate`` on a Spec with very many problems: a valid Spec
with ``--keys`` unknown top-level keys (300,000 by default, a ~5 MB YAML file), checked by the
sources named with ``--src`` (each a ``src`` folder: one before a change, one after), alternated
A B A B in one run.

Each figure is one ``egress validate`` process: its wall time (``time.perf_counter`` around it), its
peak RSS (``os.wait4``'s ``ru_maxrss``, in MB) and how many lines it printed; the load average is
printed before and after. Run from the repository::

    PYTHONPATH=src .venv/bin/python benchmarks/spec_problems.py --src OLD/src --src src
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VALID = "pipeline: p\nstreams:\n  s:\n    schema:\n      - {name: a, type: string}\n"


def validate(src: Path, spec: Path) -> tuple[float, float, int]:
    """Run ``egress validate spec`` with ``src`` first on the path: (seconds, peak RSS in MB, lines printed)."""
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    with tempfile.TemporaryFile() as output:
        start = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-c", "from egress.cli.entry import main; main()", "validate",
                                    str(spec)], env=env, stdout=output, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        output.seek(0)
        lines = output.read().count(b"\n")
    return elapsed, usage.ru_maxrss / 1024, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", type=Path, required=True, help="a src folder (repeat: A, B, ...)")
    parser.add_argument("--keys", type=int, default=300_000, help="unknown top-level keys in the Spec")
    parser.add_argument("--rounds", type=int, default=2)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "spec.yaml"
        spec.write_text(VALID + "".join(f"unknown_{i}: 1\n" for i in range(arguments.keys)))
        print(f"load average {os.getloadavg()}; {arguments.keys} unknown keys, {spec.stat().st_size} bytes")
        for _ in range(arguments.rounds):
            for src in arguments.src:
                seconds, megabytes, lines = validate(src, spec)
                print(f"{src}: {seconds:.2f} s, peak RSS {megabytes:.0f} MB, {lines} lines printed")
        print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
