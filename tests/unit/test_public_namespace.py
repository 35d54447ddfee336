"""``import egress`` is what a process function's module does: it must stay light (no HTTP client,
no storage engine), so a user's tests and tools import it cheaply."""

from __future__ import annotations

import subprocess
import sys

import egress
import egress.runtime
import egress.throttler

HEAVY = ("pycurl", "aiohttp", "sqlite3", "nats", "egress.engines", "egress.httpclient", "egress.connectors")


def test_import_egress_loads_no_http_client_and_no_storage_engine() -> None:
    probe = f"import sys, egress; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""


def test_the_lazy_namespaces_still_export_every_name() -> None:
    for package in (egress, egress.runtime, egress.throttler):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"
