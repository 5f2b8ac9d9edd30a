"""A real PgBouncer (Debian's 1.18) for the tests, on a free loopback port.

It runs as the same unprivileged user as the PostgreSQL servers (PgBouncer refuses root).
Its [databases] section %includes the file lagwatch owns.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from lagwatch.pgbinaries import run_user
from lagwatch.ports import free_port

PGBOUNCER = "/usr/sbin/pgbouncer"


class PgBouncerServer:
    def __init__(self, *, primary_dsn_entry: str, include_name: str = "lagwatch-replicas.ini",
                 pool_mode: str = "transaction") -> None:
        # Its own folder under /tmp: pytest's tmp folders are private to root, and
        # PgBouncer runs unprivileged.
        workdir = Path(tempfile.mkdtemp(prefix="lagwatch-pgbouncer-"))
        self.workdir = workdir
        self.port = free_port(["127.0.0.1"])
        self.ini = workdir / "pgbouncer.ini"
        self.include_file = workdir / include_name
        self.log_file = workdir / "pgbouncer.log"
        self.pid_file = workdir / "pgbouncer.pid"
        user = run_user()
        workdir.chmod(0o777)  # PgBouncer (unprivileged) writes its log and pid here
        (workdir / "userlist.txt").write_text('"postgres" ""\n"pgbouncer" ""\n')
        self.ini.write_text(f"""[databases]
app_rw = {primary_dsn_entry}
%include {self.include_file}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir / 'userlist.txt'}
admin_users = pgbouncer
pool_mode = {pool_mode}
max_client_conn = 200
default_pool_size = 10
server_login_retry = 1
logfile = {self.log_file}
pidfile = {self.pid_file}
""")
        self._user = user
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def admin_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=pgbouncer dbname=pgbouncer"

    def dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def start(self, timeout: float = 15) -> None:
        kwargs = {}
        if self._user.uid is not None:
            kwargs = {"user": self._user.uid, "group": self._user.gid}
        self.proc = subprocess.Popen([PGBOUNCER, str(self.ini)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, **kwargs)  # type: ignore[call-overload]
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
        raise RuntimeError(f"pgbouncer did not come up: {self.log_tail()}")

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
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
            return "(no log)"

    def __enter__(self) -> PgBouncerServer:
        try:
            self.start()
        except BaseException:
            self.cleanup()  # __exit__ will not run: remove the folder (and any process) now
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def readable_by_servers(path: Path) -> None:
    """Let the unprivileged PgBouncer read a file lagwatch (root) writes."""
    os.chmod(path, 0o644)
