"""A real ``redis-server`` process owned by a test: free port, its own temp dir, never a shared server."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis

REDIS_BINARY = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port(below: int = 65536, *, bus: bool = False) -> int:
    """A port nothing listens on now (``below``: Redis Cluster wants data ports under 55536; ``bus``: and its
    cluster bus port, the port + 10000, free too, or the node cannot start)."""
    for _ in range(1000):
        with socket.socket() as s, socket.socket() as bus_socket:
            try:
                s.bind(("127.0.0.1", 0 if below > 65535 else random.randrange(20_000, below)))
                if bus:
                    bus_socket.bind(("127.0.0.1", s.getsockname()[1] + 10_000))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")


def end_process(process: subprocess.Popen[bytes] | None, *, crash: bool = False) -> None:
    """End a server a test started: SIGKILL (``crash``: what a crash does), else SIGTERM and, after
    10 s, SIGKILL."""
    if process is None or process.poll() is not None:
        return
    if crash:
        process.kill()
    else:
        process.terminate()
        try:
            process.wait(10)
            return
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait(10)


class RedisProcess:
    """``start()`` / ``kill()`` / ``start()`` again on the same port and directory (AOF survives)."""

    def __init__(
        self,
        directory: Path,
        *,
        aof: bool = False,
        port: int | None = None,
        extra: tuple[str, ...] = (),
        tls: tuple[Path, Path, Path] | None = None,
    ) -> None:
        """``tls``: (certificate, key, CA certificate) files; the server then speaks TLS only."""
        if not Path(REDIS_BINARY).exists():
            pytest.fail("redis-server is not installed (make system-deps installs the Debian package redis-server)")
        self.directory = directory
        self.port = port or free_port()
        self.aof = aof
        self.extra = extra
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.tls:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls[2]}"
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.tls:
            cert, key, ca = self.tls
            ports = [
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                str(cert),
                "--tls-key-file",
                str(key),
                "--tls-ca-cert-file",
                str(ca),
                "--tls-auth-clients",
                "no",
            ]
        else:
            ports = ["--port", str(self.port)]
        args = [
            REDIS_BINARY,
            *ports,
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.aof else "no",
            "--appendfsync", "always",
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
            *self.extra,
        ]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        client = self.client()
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except (redis.ConnectionError, redis.BusyLoadingError):
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                        raise RuntimeError(f"redis-server did not start on port {self.port}:\n{log}") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: what a crash does (with ``appendfsync always`` nothing acknowledged is lost)."""
        end_process(self.process, crash=True)

    def stop(self) -> None:
        end_process(self.process)

    def client(self) -> redis.Redis:
        if self.tls:
            return redis.Redis(port=self.port, ssl=True, ssl_ca_certs=str(self.tls[2]), socket_connect_timeout=0.5)
        return redis.Redis(port=self.port, socket_connect_timeout=0.5)


class RedisCluster:
    """A three-primary Redis Cluster (no replicas) of real processes, for the store's cluster mode."""

    def __init__(self, directory: Path, n: int = 3) -> None:
        self.nodes = [
            RedisProcess(
                directory / f"node{i}",
                port=free_port(below=55536, bus=True),
                extra=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ),
            )
            for i in range(n)
        ]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> RedisCluster:
        for node in self.nodes:
            node.start()
        cli = shutil.which("redis-cli")
        if cli is None:
            pytest.fail("redis-cli is not installed (make system-deps installs the Debian package redis-tools)")
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while True:
            states = [node.client().execute_command("CLUSTER INFO").get("cluster_state") for node in self.nodes]
            if all(state == "ok" for state in states):
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"Redis Cluster did not become ok: {states}")
            time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
