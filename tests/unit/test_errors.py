"""The exception tree drawn in ``egress.errors``'s docstring is the one the code has: every class
under ``EgressError`` in every module of ``egress`` is drawn, under the parent it has, and every
class drawn exists; every exception egress defines is an ``EgressError`` unless it is private."""

from __future__ import annotations

import builtins
import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import egress.errors
from egress.errors import EgressError

_NODE = re.compile(r"^(?P<indent>(?:│   |    )*)(?:├── |└── )(?P<name>\w+)(?P<description>.*)$")
_ALSO = re.compile(r"also an? (\w+)")


def _all_modules() -> list[ModuleType]:
    return [importlib.import_module(found.name) for found in pkgutil.walk_packages(egress.__path__, "egress.")
            if found.name != "egress.__main__"]


def _drawn_tree() -> dict[str, set[str]]:
    """Each class drawn in ``egress.errors``'s docstring, with its parents: the node above it and
    every class its description says it is "also a"."""
    lines = (egress.errors.__doc__ or "").splitlines()
    root = lines.index("    EgressError")
    parents: dict[str, set[str]] = {}
    path = ["EgressError"]
    for line in lines[root + 1:]:
        if not line.strip():
            break
        node = _NODE.match(line[4:])
        if node is None:
            continue  # a description's continuation line
        depth = len(node["indent"]) // 4 + 1
        path[depth:] = [node["name"]]
        parents[node["name"]] = {path[depth - 1], *_ALSO.findall(node["description"])}
    return parents


def _coded_tree() -> dict[str, set[str]]:
    """Each subclass of ``EgressError`` defined in ``egress``, with the names of its bases."""
    found: dict[str, set[str]] = {}
    pending = [EgressError]
    while pending:
        for sub in pending.pop().__subclasses__():
            if sub.__module__.startswith("egress.") and sub.__name__ not in found:
                found[sub.__name__] = {base.__name__ for base in sub.__bases__}
                pending.append(sub)
    return found


def test_the_drawn_tree_is_the_tree_of_the_code() -> None:
    _all_modules()
    drawn, coded = _drawn_tree(), _coded_tree()
    assert len(drawn) > 40  # the drawing was parsed, not skipped
    assert sorted(set(coded) - set(drawn)) == [], "classes the drawing lacks"
    assert sorted(set(drawn) - set(coded)) == [], "classes drawn that the code lacks"
    assert {name: bases for name, bases in coded.items() if drawn[name] != bases} == {}, "parents that differ"


def test_every_public_exception_of_egress_is_an_egress_error() -> None:
    outside = []
    for module in _all_modules():
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__
                    and not issubclass(value, EgressError) and not name.startswith("_")):
                outside.append(f"{module.__name__}.{name}")
    assert outside == []


def test_a_built_in_base_is_drawn_as_also_a() -> None:
    _all_modules()
    builtin_bases = {name for bases in _coded_tree().values() for name in bases if hasattr(builtins, name)}
    assert builtin_bases == {"ValueError", "KeyError"}


def test_fenced_and_engine_unavailable_errors_are_re_exported_by_the_engines() -> None:
    from egress.engines import EngineUnavailableError, FencedError
    from egress.engines.nats import NatsUnavailableError

    assert FencedError is egress.errors.FencedError
    assert EngineUnavailableError is egress.errors.EngineUnavailableError
    assert issubclass(NatsUnavailableError, EngineUnavailableError)
