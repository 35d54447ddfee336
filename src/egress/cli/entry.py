"""The ``egress`` program's entry point (``egress`` and ``python -m egress``).

It imports the command line itself, so that a Ctrl-C during those imports (a few tenths of a second
on a busy machine) says ``interrupted`` and exits 130, as one during a command does
(:func:`egress.cli.main.main`), instead of Python's ``KeyboardInterrupt`` traceback."""

from __future__ import annotations

import sys

from egress.cli.exit_codes import INTERRUPTED


def main() -> None:
    """Import the command line and run it: :func:`egress.cli.main.main`."""
    try:
        from egress.cli.main import main as program
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)
    program()
