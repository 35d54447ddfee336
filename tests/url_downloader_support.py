"""Shared pieces of the URL downloader tests: a free port on the site addresses, the spec with a
given input file, and what the sites hold (sha256 per URL)."""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import yaml
from examples.url_downloader import serve

EXAMPLE = Path(serve.__file__).resolve().parent


def free_port() -> int:
    """A port free on every site address (checked by binding each)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.2", 0))
            port = int(probe.getsockname()[1])
        try:
            for index in range(len(serve.hosts(port))):
                with socket.socket() as other:
                    other.bind((f"127.0.0.{index + 2}", port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on every site address")


def expected_files(port: int) -> dict[str, tuple[int, str]]:
    """URL → (bytes, sha256) of the file it names."""
    return {f"http://{host}/{file.name}": (file.stat().st_size, hashlib.sha256(file.read_bytes()).hexdigest())
            for host, folder in serve.hosts(port).items() for file in folder.iterdir() if file.is_file()}


def write_pipeline(directory: Path, port: int, *, check_host_period: str = "1500ms",
                   politeness_delay: str = "20ms") -> tuple[Path, Path]:
    """The example's spec and dynamic spec reading a URL list for ``port``; returns their paths."""
    urls = directory / "urls.jsonl"
    serve.write_urls(urls, port)
    spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    spec["sources"]["urls"]["parameters"]["path"] = str(urls)
    spec["computations"]["url_downloader"]["processing_function_parameters"]["politeness_delay"] = politeness_delay
    dynamic = yaml.safe_load((EXAMPLE / "dynamic_spec.yaml").read_text())
    dynamic["computations"]["url_downloader"]["processing_function_parameters"]["check_host_period"] = \
        check_host_period
    spec_path, dynamic_path = directory / "spec.yaml", directory / "dynamic_spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    dynamic_path.write_text(yaml.safe_dump(dynamic, sort_keys=False))
    return spec_path, dynamic_path


def server_log(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
