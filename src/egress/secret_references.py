"""Secrets by reference: the one place that reads what a Spec's ``*_env`` or ``*_file`` names.

A secret (the http source's bearer token, a Firehose access key, webhook signing secrets) is never
a value in a Spec or on a command line: the Spec names an environment variable or a file, and the
component reads it when it needs it (at start, or at each attempt so that a rotated key applies).
Each component checks the form of what it read (one line, ``whsec_`` words, ...); this module only
reads, and says where a reference fails without ever saying the secret.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from egress.errors import SecretUnavailable

VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""What an environment variable's name is made of (POSIX's portable names): a reference that is
not one is most likely the secret itself, written where its variable's name belongs."""


def variable(name: str) -> str:
    """``environment variable NAME`` for a message about the reference ``name``; when ``name`` is not
    a variable's name (:data:`VARIABLE_NAME`: e.g. a ``whsec_…`` secret written in its place) a
    description that does not repeat it, since it may be the secret."""
    if VARIABLE_NAME.fullmatch(name):
        return f"environment variable {name}"
    return ("the environment variable named here (not a variable's name: if it is the secret itself, put it "
            "in a variable, `export NAME=...`, and write NAME instead)")


def read_secret(*, env: str | None = None, file: str | Path | None = None) -> str | None:
    """The text ``env`` or ``file`` names: the value of the environment variable ``env``, or the
    whole content of ``file`` (UTF-8, as it is: the caller strips what its form allows); ``None``
    when neither is given (``env`` wins when both are). A relative ``file`` is relative to the
    working directory: a Spec's references are made to start at its folder when it is planned.

    Raises :class:`~egress.errors.SecretUnavailable` when the variable is unset or the file cannot
    be read or is not UTF-8; its ``where`` is :func:`variable` of ``env`` or ``"file PATH"``."""
    if env is not None:
        value = os.environ.get(env)
        if value is None:
            raise SecretUnavailable(variable(env), "is not set")
        return value
    if file is None:
        return None
    try:
        return Path(file).read_text(encoding="utf-8")
    except OSError as error:
        reason = error.strerror or error.__class__.__name__
        raise SecretUnavailable(f"file {file}", f"cannot be read ({reason})") from None
    except UnicodeDecodeError:
        raise SecretUnavailable(f"file {file}", "is not UTF-8 text") from None


__all__ = ["read_secret", "variable"]
