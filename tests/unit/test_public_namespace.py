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


def _loaded_by(statement: str) -> list[str]:
    """The modules a fresh interpreter has loaded after ``statement`` that it had not before."""
    probe = (f"import sys; before = set(sys.modules); {statement}; "
             "print(' '.join(sorted(set(sys.modules) - before)))")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()


def test_import_egress_alone_loads_only_the_package_and_its_lazy_exports() -> None:
    loaded = _loaded_by("import egress")
    assert [m for m in loaded if m.split(".")[0] == "egress"] == ["egress", "egress.lazy"]
    assert len(loaded) <= 40, loaded  # 31 today: importlib's own and typing's, no third-party library


def test_the_process_function_api_loads_no_http_client_no_engine_and_no_cli() -> None:
    third_party = ("pycurl", "aiohttp", "sqlite3", "nats", "typer", "rich", "yaml", "prometheus_client")
    egress_heavy = ("egress.engines", "egress.httpclient", "egress.connectors", "egress.cli", "egress.spec")
    loaded = _loaded_by("from egress import ProcessFunction, Message, RuntimeContext, StateClient")
    assert [m for m in loaded if m.split(".")[0] in third_party or m.startswith(egress_heavy)] == []
    assert len([m for m in loaded if m.split(".")[0] == "egress"]) <= 12  # 12 today, of 196 modules
    loaded = _loaded_by("from egress import ThrottlerHandle")  # the throttler's client, its metrics and models
    assert [m for m in loaded if m.split(".")[0] in third_party[:6] or m.startswith(egress_heavy[:4])] == []


def test_the_lazy_namespaces_still_export_every_name() -> None:
    for package in (egress, egress.runtime, egress.throttler):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"


def test_a_lazy_module_imports_its_module_on_the_first_attribute_read() -> None:
    probe = ("import sys; from egress.lazy import lazy_module; m = lazy_module('json.tool'); "
             "before = 'json.tool' in sys.modules; main = m.main; "
             "print(before, 'json.tool' in sys.modules, main is sys.modules['json.tool'].main)")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert shown == ["False", "True", "True"]


def test_the_firehose_package_exports_its_names_lazily_without_importing_aiohttp() -> None:
    probe = ("import sys, egress.firehose as f; from egress.firehose import protocol; "
             "print('aiohttp' in sys.modules, f.FirehoseRecord is protocol.FirehoseRecord)")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert shown == ["False", "True"]
    import egress.firehose

    for name in egress.firehose.__all__:
        assert getattr(egress.firehose, name) is not None, f"egress.firehose.{name}"


def test_the_connectors_declared_by_name_are_the_ones_their_modules_register() -> None:
    import importlib

    from egress.connectors import SINKS, SOURCES

    for registry in (SOURCES, SINKS):
        declared = dict(registry._modules)
        for module in set(declared.values()):
            importlib.import_module(module)
        assert set(declared) <= set(registry._classes), registry.kind  # tests may register their own
        for name, module in declared.items():
            assert registry.get(name).__module__ == module, name


def test_importing_the_cli_imports_no_connector_until_a_spec_names_it() -> None:
    probe = ("import sys, egress.cli.main; from egress.connectors import SINKS; "
             "before = sorted(m for m in sys.modules if m.startswith('egress.connectors.s') and m.count('.') == 3); "
             "SINKS.get('async_http'); print(before, 'egress.connectors.sinks.async_http' in sys.modules, "
             "'egress.connectors.sinks.firehose_http' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    # Only the sources' small protocol modules (what the source reader checks a source for) load early.
    assert shown == ["['egress.connectors.sources.chunks',", "'egress.connectors.sources.live',",
                     "'egress.connectors.sources.unread']", "True", "False"]
