"""The ``egress`` program's entry point (``egress`` and ``python -m egress``).

It imports the command line itself, so that a Ctrl-C during those imports (a few tenths of a second
on a busy machine) or before a command handles its own says ``interrupted`` and exits 130, instead
of Python's ``KeyboardInterrupt`` traceback."""

from __future__ import annotations

import sys

from egress.cli.exit_codes import INTERRUPTED


def main() -> None:
    """Import the command line and run it (:func:`egress.cli.main.main`); a Ctrl-C that reaches
    here, in the imports or before a command handles its own (a command's imports, a Spec's load),
    says ``interrupted`` and exits 130."""
    try:
        from egress.cli.main import main as program

        program()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)
