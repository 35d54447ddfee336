"""Lazy exports of a package (PEP 562): a name is imported from its module when first used, so
importing the package loads only what its caller touches (``import egress`` stays light)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The module-level ``__getattr__`` of ``package``: ``exports`` maps each exported name to the
    module that defines it; the value is kept in the package once imported. Raises
    ``AttributeError`` for any other name."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


class LazyModule:
    """A stand-in for the module ``name`` that imports it on the first attribute read (``web =
    lazy_module("aiohttp.web")`` then ``web.Application``): a module that needs a heavy library
    only in some of its functions (a server, a transport) can be imported without it, so that
    ``egress run`` loads aiohttp or nats only when the Spec and the command line use them. Raises
    the import's own ``ImportError`` on that first read if the module is missing."""

    __slots__ = ("_module", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: Any = None

    def __getattr__(self, attribute: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attribute)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}{'' if self._module is None else ' (imported)'}>"


def lazy_module(name: str) -> Any:
    """The module ``name``, imported on its first use (:class:`LazyModule`). Declare it for type
    checkers with ``if TYPE_CHECKING: from aiohttp import web`` / ``else: web = lazy_module(...)``."""
    return LazyModule(name)
