"""The demo's read pool: Debian's PgBouncer when it is installed, on a free loopback port.

Its ``[databases]`` section includes a file lagwatch owns; database ``app_ro`` is the read
pool lagwatch rewrites. PgBouncer refuses to run as root, so it runs as the servers' user
(``lagwatch.pgbinaries``), in a folder of the demo cluster's, removed with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import psycopg

from lagwatch.localcluster import LocalCluster
from lagwatch.pgbinaries import mkdir_owned, run_user
from lagwatch.ports import free_port

PGBOUNCER = Path("/usr/sbin/pgbouncer")
DATABASE = "app_ro"


class DemoPgBouncer:
    def __init__(self, cluster: LocalCluster) -> None:
        self.folder = cluster.base_dir / "pgbouncer"
        self.port = free_port(["127.0.0.1"])
        self.include_file = self.folder / "read-pool.ini"
        self.log_file = self.folder / "pgbouncer.log"
        self.proc: subprocess.Popen[bytes] | None = None
        first = cluster.replicas[0]
        # Replicas share one port (LocalCluster); the entry starts with every replica in.
        self.options = f"port={first.port} dbname=postgres"
        self._hosts = ",".join(r.host for r in cluster.replicas)

    @staticmethod
    def available() -> bool:
        return os.access(PGBOUNCER, os.X_OK)

    @property
    def admin_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=pgbouncer dbname=pgbouncer"

    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={DATABASE}"

    def __enter__(self) -> DemoPgBouncer:
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
        self.include_file.write_text(f"{DATABASE} = host={self._hosts} {self.options}\n")
        os.chmod(self.include_file, 0o644)  # lagwatch (maybe root) writes it, PgBouncer reads it
        ini = self.folder / "pgbouncer.ini"
        ini.write_text(f"""[databases]
%include {self.include_file}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.folder / 'userlist.txt'}
admin_users = pgbouncer
pool_mode = transaction
server_login_retry = 1
logfile = {self.log_file}
pidfile = {self.folder / 'pgbouncer.pid'}
""")
        user = run_user()
        self.proc = subprocess.Popen([str(PGBOUNCER), str(ini)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, user=user.uid, group=user.gid,
                                     extra_groups=[] if user.uid is not None else None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited {self.proc.returncode}; see {self.log_file}")
            try:
                with psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=2) as conn:
                    conn.execute("SHOW VERSION")
                return
            except psycopg.Error:
                time.sleep(0.1)
        raise RuntimeError(f"pgbouncer did not answer within {timeout:g}s; see {self.log_file}")

    def stop(self) -> None:
        """SIGTERM our PgBouncer (by the PID we started) and wait for it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
