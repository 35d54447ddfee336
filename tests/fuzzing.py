"""The hypothesis settings of the fuzz tests (``tests/**/test_*fuzz*``).

In CI every fuzz test runs a bounded number of examples, derandomized (a fixed seed: the same
examples every run, so a failure reproduces); ``EGRESS_FUZZ_SCALE=N`` multiplies the examples for
a longer run, and ``EGRESS_FUZZ_SEED`` picks another seed for it (docs/reliability.md, Fuzzing).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar
from unittest import mock

import typer.testing
from hypothesis import HealthCheck, seed, settings
from typer.testing import CliRunner, Result

SCALE = int(os.environ.get("EGRESS_FUZZ_SCALE", "1"))
SEED = os.environ.get("EGRESS_FUZZ_SEED")

Test = TypeVar("Test", bound=Callable[..., Any])


def fuzz(examples: int) -> Callable[[Test], Test]:
    """Decorate a ``@given`` test: ``examples`` × ``EGRESS_FUZZ_SCALE`` examples, no deadline, no
    example database, derandomized unless ``EGRESS_FUZZ_SEED`` is set (then seeded with it)."""
    chosen = settings(max_examples=examples * SCALE, deadline=None, database=None, derandomize=SEED is None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                             HealthCheck.filter_too_much])

    def decorate(test: Test) -> Test:
        decorated = chosen(test)
        return seed(int(SEED))(decorated) if SEED is not None else decorated

    return decorate


@functools.cache
def _egress_command(app: typer.Typer) -> Any:
    return typer.main.get_command(app)


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    """Run ``egress ARGS`` in process with typer's ``CliRunner``, the click command built once
    (the runner rebuilds it per call: 50 ms, most of a fuzz example)."""
    from egress.cli.main import app

    with mock.patch.object(typer.testing, "_get_command", _egress_command):
        return CliRunner().invoke(app, args, env=env)
