"""A real nginx on loopback for tests, benchmarks and demos: a generated config in a folder of its own.

:class:`Nginx` writes ``nginx.conf`` (the ``http`` block's body given by the caller) into a folder
with its own pid, log and temp paths, so no root, no ``/var/log/nginx`` and no ``/etc/nginx`` are
needed; :meth:`Nginx.start` runs ``nginx -g 'daemon off;'`` as a child process and waits until it
answers on its port; :meth:`Nginx.stop` ends it by that child's PID (``SIGTERM``, then ``SIGKILL``
after a timeout). :func:`nginx_binary` finds the binary (``/usr/sbin/nginx`` on
Debian, else ``nginx`` on ``PATH``); :func:`require_nginx` skips a test when it is truly absent,
saying how to install it.

Helpers for the configs used here: :func:`balancer_config` (an ``upstream`` over workers with
``proxy_next_upstream``) and :func:`answering_config` (an endpoint answering every request 200 at
once, for a benchmark's sink).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.ports import free_port as free_port  # re-exported: tests import it from here

DEBIAN_NGINX = Path("/usr/sbin/nginx")


def nginx_binary() -> Path | None:
    """The nginx binary: ``/usr/sbin/nginx`` (Debian's package), else ``nginx`` on ``PATH``, else ``None``."""
    if DEBIAN_NGINX.is_file() and os.access(DEBIAN_NGINX, os.X_OK):
        return DEBIAN_NGINX
    found = shutil.which("nginx")
    return Path(found) if found else None


def require_nginx() -> Path:
    """The nginx binary, or skip the calling test naming the fix (``apt-get install nginx``, as ``.ci/run`` does)."""
    binary = nginx_binary()
    if binary is None:
        import pytest

        pytest.skip("nginx is not installed (no /usr/sbin/nginx, none on PATH): apt-get install nginx "
                    "(.ci/run installs it)")
    return binary


def balancer_config(port: int, upstreams: list[int], *, fail_timeout: float = 1.0,
                    read_timeout: float = 30.0, next_upstream_tries: int = 0) -> str:
    """An ``http`` block body: nginx on ``127.0.0.1:port`` balancing POSTs over ``127.0.0.1:<upstreams>``.

    ``proxy_next_upstream error timeout http_502 http_503 non_idempotent``: a request whose worker
    refuses the connection, breaks it before answering, or answers ``503`` (stopping) is sent to
    the next worker; ``non_idempotent`` because the http source's POSTs are safe to send again
    (an ``Idempotency-Key`` makes a second copy a duplicate, and a request not answered ``200``
    was not promised). ``max_fails=1 fail_timeout``: a dead worker is skipped for ``fail_timeout``
    seconds after one failure. ``read_timeout`` (seconds): how long a worker may take to answer
    (a ``200`` waits for the commit of its epoch)."""
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=1 fail_timeout={fail_timeout:g}s;" for p in upstreams)
    return f"""
    upstream workers {{
{servers}
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://workers;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_next_upstream error timeout http_502 http_503 non_idempotent;
            proxy_next_upstream_tries {next_upstream_tries};
            proxy_connect_timeout 1s;
            proxy_read_timeout {read_timeout:g}s;
            proxy_request_buffering on;
        }}
    }}
"""


def answering_config(port: int) -> str:
    """An ``http`` block body: ``127.0.0.1:port`` answers every request ``200`` with an empty body
    (the body read and dropped), keeping connections alive: an endpoint that costs its client nothing."""
    return f"""
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        keepalive_requests 1000000;
        client_body_buffer_size 1m;
        location / {{
            return 200;
        }}
    }}
"""


class Nginx:
    """nginx on loopback from a generated config in ``folder`` (created), listening on ``port``.

    ``http_body``: the body of the config's ``http`` block (see :func:`balancer_config`);
    ``workers``: nginx worker processes. The ``error.log`` stays in ``folder`` for a failing test."""

    def __init__(self, folder: Path, port: int, http_body: str, workers: int = 1) -> None:
        self.folder = folder
        self.port = port
        self.http_body = http_body
        self.workers = workers
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        folder = self.folder
        temp = "\n".join(f"    {name}_temp_path {folder / 'temp' / name};"
                         for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        # As root the workers would switch to ``nobody``, who cannot write the temp paths in ``folder``.
        user = "user root;\n" if os.geteuid() == 0 else ""
        return f"""{user}worker_processes {self.workers};
pid {folder / 'nginx.pid'};
error_log {folder / 'error.log'} warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
{temp}
{self.http_body}
}}
"""

    def start(self, timeout: float = 10.0) -> Nginx:
        """Write the config, start nginx and wait until its port accepts; raises ``RuntimeError``
        with the error log when nginx exits or does not listen within ``timeout`` seconds."""
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed: apt-get install nginx")
        (self.folder / "temp").mkdir(parents=True, exist_ok=True)
        config = self.folder / "nginx.conf"
        config.write_text(self.config())
        stderr = (self.folder / "stderr.log").open("wb")
        self.process = subprocess.Popen(
            [str(binary), "-p", str(self.folder), "-e", str(self.folder / "error.log"), "-c", str(config),
             "-g", "daemon off;"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        stderr.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited {self.process.returncode}: {self._errors()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"nginx did not listen on 127.0.0.1:{self.port} within {timeout:g} s: {self._errors()}")

    def stop(self, timeout: float = 10.0) -> None:
        """End nginx by its master's PID (``SIGTERM``: a fast stop that closes connections, then
        ``SIGKILL`` after ``timeout`` s); its workers follow."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout)

    def _errors(self) -> str:
        texts = [(self.folder / name).read_text()[-2000:] for name in ("stderr.log", "error.log")
                 if (self.folder / name).exists()]
        return " | ".join(t.strip() for t in texts if t.strip()) or "(no error log)"

    def __enter__(self) -> Nginx:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
