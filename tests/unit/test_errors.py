"""The exception tree drawn in ``egress.errors``'s docstring is the one the code has."""

from __future__ import annotations

import importlib
import pkgutil

import egress
import egress.errors
from egress.errors import EgressError


def _all_subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _all_subclasses(sub)
    return found


def test_every_egress_error_is_drawn_in_the_docstring_of_errors() -> None:
    for module in pkgutil.walk_packages(egress.__path__, "egress."):
        if module.name != "egress.__main__":
            importlib.import_module(module.name)
    names = {cls.__name__ for cls in _all_subclasses(EgressError) if cls.__module__.startswith("egress.")}
    doc = egress.errors.__doc__ or ""
    assert sorted(name for name in names if name not in doc) == []


def test_fenced_and_redirect_errors_are_egress_errors() -> None:
    from egress.engines import FencedError
    from egress.httpclient.redirects import RedirectError

    assert issubclass(FencedError, EgressError)
    assert issubclass(RedirectError, EgressError)
