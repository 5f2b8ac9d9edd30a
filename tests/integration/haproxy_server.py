"""A real HAProxy (Debian's /usr/sbin/haproxy) run as a child process for the pooler tests.

Only loopback is bound. The runtime state (admin states set over the socket) lives in the
process only: ``restart()`` loses it, as a real restart without a server-state-file does.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from lagwatch.demo.ports import free_port

HAPROXY = Path("/usr/sbin/haproxy")
_SUN_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux


class HAProxyServer:
    def __init__(self, workdir: Path, backend: str, servers: dict[str, tuple[str, int]],
                 *, binary: Path = HAPROXY) -> None:
        self.workdir = workdir
        self.backend = backend
        self.servers = dict(servers)
        self.binary = binary
        self.socket = workdir / "admin.sock"
        if len(str(self.socket).encode()) > _SUN_PATH_MAX:
            raise ValueError(f"socket path too long for AF_UNIX: {self.socket}")
        self.port = free_port(["127.0.0.1"])
        self.config_file = workdir / "haproxy.cfg"
        self.log_file = workdir / "haproxy.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._write_config()

    def _write_config(self) -> None:
        lines = [
            "global",
            f"    stats socket {self.socket} mode 600 level admin",
            "    maxconn 256",  # else derived from the fd limit, which may be huge
            "    nbthread 1",
            "",
            "defaults",
            "    mode tcp",
            "    timeout connect 1s",
            "    timeout client 10s",
            "    timeout server 10s",
            "",
            f"listen {self.backend}",
            f"    bind 127.0.0.1:{self.port}",
            "    balance roundrobin",
        ]
        lines += [f"    server {name} {host}:{port} check inter 1s"
                  for name, (host, port) in self.servers.items()]
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text("\n".join(lines) + "\n")

    def command(self, line: str, timeout: float = 2.0) -> str:
        """One runtime-API command, read to EOF (for tests to look behind the adapter's back)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.socket))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while data := sock.recv(65536):
                chunks.append(data)
        return b"".join(chunks).decode()

    def start(self, timeout: float = 10.0) -> None:
        if self.proc is not None:
            raise RuntimeError("HAProxy already started")
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()  # a stale one from a killed run would look alive to nobody
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen([str(self.binary), "-f", str(self.config_file), "-db"],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise RuntimeError(f"HAProxy exited with {code} at start:\n{self._log_tail()}")
            with contextlib.suppress(OSError):
                if self.command("show info", timeout=0.5).startswith("Name:"):
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"HAProxy socket {self.socket} did not answer in {timeout}s:\n{self._log_tail()}")
            time.sleep(0.02)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> HAProxyServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
