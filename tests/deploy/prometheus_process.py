"""A real Prometheus server (and promtool) owned by a test: free port, its own temp dir, stopped by the test."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def require(binary: str) -> str:
    """The binary's path; the test fails (not skips) when it is missing."""
    if not Path(binary).exists():
        pytest.fail(f"{binary} is not installed (make system-deps installs the Debian package prometheus)")
    return binary


def promtool(*args: str, cwd: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool *args`` (``stdin``: what it reads, e.g. a scrape for ``check metrics``)."""
    return subprocess.run(
        [require(PROMTOOL), *args], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusProcess:
    """``start()`` a Prometheus on ``config`` (a dict, written as YAML), query its HTTP API, ``stop()``."""

    def __init__(self, directory: Path, config: dict[str, Any]) -> None:
        self.directory = directory
        self.config = config
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = directory / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> PrometheusProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        config_path = self.directory / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    require(PROMETHEUS),
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={self.directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"prometheus exited with {self.process.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"prometheus not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def api(self, path: str, **params: str) -> tuple[int, dict[str, Any]]:
        """(HTTP status, decoded JSON body) of a GET on the HTTP API; errors (400, 422...) are returned too."""
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result of an instant query, which must parse and evaluate (HTTP 200, status success)."""
        status, body = self.api("/api/v1/query", query=expr)
        assert status == 200 and body.get("status") == "success", f"query {expr!r} failed: {status} {body}"
        assert body["data"]["resultType"] == "vector", f"query {expr!r} is not a vector: {body['data']}"
        return body["data"]["result"]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None
