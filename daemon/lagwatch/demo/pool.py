"""A real PgBouncer (Debian's) on a free loopback port: the demo's read pool, and the tests'.

Its ``[databases]`` section holds the entries it is given, then includes a file lagwatch
owns (for the demo, database ``app_ro``: the read pool lagwatch rewrites). PgBouncer
refuses to run as root, so it runs as the servers' user (``lagwatch.demo.binaries``), in a
folder of its own, and is stopped by the PID it was started with.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import psycopg

from lagwatch.demo.binaries import mkdir_owned, run_user
from lagwatch.demo.cluster import LocalCluster
from lagwatch.demo.ports import free_port

PGBOUNCER = Path("/usr/sbin/pgbouncer")
DATABASE = "app_ro"


class PgBouncer:
    """PgBouncer in ``folder``, its [databases] section ``databases`` (``name = ...`` lines)
    and an %include of ``include_file``, which must exist before ``start``."""

    def __init__(self, folder: Path, include_file: Path, databases: Sequence[str] = (),
                 pool_mode: str = "transaction") -> None:
        self.folder = folder
        self.include_file = include_file
        self.databases = tuple(databases)
        self.pool_mode = pool_mode
        self.port = free_port(["127.0.0.1"])
        self.ini = folder / "pgbouncer.ini"
        self.log_file = folder / "pgbouncer.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return os.access(PGBOUNCER, os.X_OK)

    @property
    def admin_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=pgbouncer dbname=pgbouncer"

    def dsn(self, database: str = DATABASE) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 15) -> None:
        mkdir_owned(self.folder, 0o755)
        (self.folder / "userlist.txt").write_text('"postgres" ""\n"pgbouncer" ""\n')
        os.chmod(self.include_file, 0o644)  # lagwatch (maybe root) writes it, PgBouncer reads it
        entries = "".join(f"{line}\n" for line in self.databases)
        self.ini.write_text(f"""[databases]
{entries}%include {self.include_file}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.folder / 'userlist.txt'}
admin_users = pgbouncer
pool_mode = {self.pool_mode}
max_client_conn = 200
default_pool_size = 10
server_login_retry = 1
logfile = {self.log_file}
pidfile = {self.folder / 'pgbouncer.pid'}
""")
        user = run_user()
        self.proc = subprocess.Popen([str(PGBOUNCER), str(self.ini)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, user=user.uid,
                                     group=user.gid, extra_groups=[] if user.uid is not None else None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited {self.proc.returncode}: {self.log_tail()}")
            try:
                with psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=2) as conn:
                    conn.execute("SHOW VERSION")
                return
            except psycopg.Error:
                time.sleep(0.1)
        raise RuntimeError(f"pgbouncer did not answer within {timeout:g}s: {self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM our PgBouncer (by the PID we started) and wait for it."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
        self.proc = None

    def show_databases(self) -> dict[str, dict[str, object]]:
        with psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=2) as conn:
            cur = conn.execute("SHOW DATABASES")
            names = [d.name for d in cur.description or []]
            return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"(no log at {self.log_file})"


class DemoPgBouncer(PgBouncer):
    """The demo's: in a folder of the demo cluster's, removed with it; ``app_ro`` starts
    with every replica in (they share one port: LocalCluster)."""

    def __init__(self, cluster: LocalCluster) -> None:
        folder = cluster.base_dir / "pgbouncer"
        super().__init__(folder, folder / "read-pool.ini")
        first = cluster.replicas[0]
        self.options = f"port={first.port} dbname=postgres"
        self._hosts = ",".join(r.host for r in cluster.replicas)

    def start(self, timeout: float = 15) -> None:
        mkdir_owned(self.folder, 0o755)
        self.include_file.write_text(f"{DATABASE} = host={self._hosts} {self.options}\n")
        super().start(timeout)
