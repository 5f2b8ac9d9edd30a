"""Real local PostgreSQL streaming-replication clusters, for ``lagwatch demo`` (and, with
what only tests do to them, tests/integration/chaoscluster.py).

Everything here binds to loopback only and only ever signals a postmaster it started
itself (the PID in ``postmaster.pid``, checked against its data directory), never a
process found by name. When lagwatch runs as root the servers run as an unprivileged
user (``lagwatch.demo.binaries``), since PostgreSQL refuses to run as root.

Deliberately free of any pytest dependency: stdlib + psycopg only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql as pgsql

from lagwatch.demo.binaries import PgBinaries, mkdir_owned, run_as_server_user

__all__ = ["INACTIVE_SLOT", "LocalReplica", "LocalServer"]

PRIMARY_HOST = "127.0.0.1"
SUPERUSER = "postgres"
INACTIVE_SLOT = "inactive"
_POLL = 0.05

_T = TypeVar("_T")


# --------------------------------------------------------------------------- helpers


def _quote_conf(value: str) -> str:
    """Quote a value the way postgresql.conf / ALTER SYSTEM do."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def conf_lines(settings: dict[str, str]) -> str:
    return "".join(f"{k} = {_quote_conf(v)}\n" for k, v in settings.items())


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"<no log: {e}>"
    return "\n".join(text.splitlines()[-lines:])


def proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(")") + 2 :].split()[0]


def _alive(pid: int) -> bool:
    # Zombies count as dead: in containers PID 1 may never reap a reparented postmaster.
    return proc_state(pid) not in (None, "Z", "X")


def signal_pid(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = _POLL) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def remaining(deadline: float, minimum: float = 1.0) -> float:
    return max(minimum, deadline - time.monotonic())


# --------------------------------------------------------------------------- servers


class LocalServer:
    """One PostgreSQL server in ``<folder>/data`` with its log and socket dir in ``<folder>``."""

    def __init__(self, name: str, host: str, port: int, datadir: Path, binaries: PgBinaries):
        self.name = name
        self.host = host
        self.port = port
        self.datadir = datadir
        self.binaries = binaries
        # postgresql.auto.conf as we wrote it; heal() puts it back if a test changed it.
        self.auto_conf: dict[str, str] = {}

    def __repr__(self) -> str:
        kind = type(self).__name__
        return f"<{kind} {self.name} {self.host}:{self.port} pg{self.binaries.major}>"

    @property
    def folder(self) -> Path:
        return self.datadir.parent

    @property
    def socket_dir(self) -> Path:
        return self.folder / "sock"

    @property
    def log_file(self) -> Path:
        return self.folder / "server.log"

    def dsn(self, dbname: str = "postgres", user: str = SUPERUSER) -> str:
        """libpq key/value conninfo for this server over TCP."""
        return f"host={self.host} port={self.port} user={user} dbname={dbname}"

    def base_settings(self) -> dict[str, str]:
        """Settings that make this server listen only on its own address and socket dir."""
        return {
            "port": str(self.port),
            "listen_addresses": self.host,
            "unix_socket_directories": str(self.socket_dir),
        }

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_file, lines)

    # -- processes

    def postmaster_pid(self) -> int | None:
        """PID of our running postmaster, or None (stale pid files are ignored)."""
        try:
            pid = int((self.datadir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None
        if not _alive(pid):
            return None
        # Guard against PID reuse: the process must be a postgres for *this* datadir.
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        return pid if os.fsencode(str(self.datadir)) in argv else None

    def is_running(self) -> bool:
        return self.postmaster_pid() is not None

    def start(self, timeout: float = 30) -> None:
        """``pg_ctl start -w`` as the server user; no-op when already running."""
        if self.is_running():
            return
        mkdir_owned(self.socket_dir)
        cmd: list[str | Path] = [
            self.binaries.tool("pg_ctl"), "start", "-D", self.datadir, "-l", self.log_file,
            "-w", "-t", str(max(1, int(timeout + 0.999))), "-s",
        ]  # fmt: skip
        try:
            r = run_as_server_user(cmd, cwd=self.folder, timeout=timeout + 15)
            err = "" if r.returncode == 0 else f"pg_ctl exit {r.returncode}: {r.stdout}{r.stderr}"
        except subprocess.TimeoutExpired:
            err = "pg_ctl start did not return"
        if err or not self.is_running():
            # pg_ctl may give up while the server is still coming up: don't leave it behind.
            self.kill()
            raise RuntimeError(
                f"{self.name} ({self.host}:{self.port}) failed to start: {err.strip()}\n"
                f"--- tail of {self.log_file} ---\n{self.log_tail()}"
            )

    def stop(self, mode: str = "fast", timeout: float = 30) -> None:
        """``pg_ctl stop -m mode -w``; SIGKILL our postmaster if that does not work."""
        pm = self.postmaster_pid()
        if pm is None:
            return
        try:
            r = run_as_server_user(
                [self.binaries.tool("pg_ctl"), "stop", "-D", self.datadir, "-m", mode,
                 "-w", "-t", str(max(1, int(timeout))), "-s"],
                cwd=self.folder, timeout=timeout + 10,
            )  # fmt: skip
            ok = r.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if not ok or _alive(pm):
            self._kill(pm)

    def kill(self) -> None:
        """SIGKILL our postmaster and its children (a crash); removes the stale pid file."""
        pm = self.postmaster_pid()
        if pm is not None:
            self._kill(pm)

    def _kill(self, pm: int) -> None:
        # Its children notice the postmaster's death and exit on their own; the tests'
        # servers (chaoscluster) also kill them and free the shared memory at once.
        signal_pid(pm, signal.SIGKILL)
        wait_until(lambda: proc_state(pm) is None, 10)  # reaped, not just dead (see _alive)
        for path in (self.datadir / "postmaster.pid", *self.socket_dir.glob(".s.PGSQL.*")):
            with contextlib.suppress(OSError):
                path.unlink()

    # -- SQL

    def execute(
        self, sql: str | pgsql.Composed | pgsql.SQL, params: tuple[Any, ...] = ()
    ) -> list[tuple[Any, ...]]:
        """Run one statement on a short-lived autocommit connection; rows or []."""
        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=5) as conn:
            # None (not ()) so that a literal '%' in parameterless SQL is left alone.
            cur = conn.execute(sql, params or None)
            return cur.fetchall() if cur.description else []

    def scalar(self, sql: str | pgsql.Composed | pgsql.SQL, params: tuple[Any, ...] = ()) -> Any:
        """First column of the first row (None if no rows)."""
        rows = self.execute(sql, params)
        return rows[0][0] if rows else None

    def reload(self) -> None:
        self.execute("SELECT pg_reload_conf()")

    def alter_system(self, name: str, value: str | None) -> None:
        """ALTER SYSTEM SET name = value (RESET when None); call reload() afterwards."""
        if value is None:
            q = pgsql.SQL("ALTER SYSTEM RESET {}").format(pgsql.Identifier(name))
        else:
            q = pgsql.SQL("ALTER SYSTEM SET {} = {}").format(
                pgsql.Identifier(name), pgsql.Literal(value)
            )
        self.execute(q)

class LocalReplica(LocalServer):
    """A streaming standby of ``primary`` using physical slot ``slot_name``."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        datadir: Path,
        binaries: PgBinaries,
        primary: LocalServer,
        *,
        application_name: str | None = None,
        slot_name: str | None = None,
    ):
        super().__init__(name, host, port, datadir, binaries)
        self.primary = primary
        self.application_name = application_name or name
        self.slot_name = slot_name or name

    @property
    def original_conninfo(self) -> str:
        """The primary_conninfo set at build time (reconnect() restores it)."""
        return (
            f"host={self.primary.host} port={self.primary.port} user={SUPERUSER} "
            f"application_name={self.application_name}"
        )

    def replica_settings(self) -> dict[str, str]:
        """Everything written to this replica's postgresql.auto.conf."""
        return {
            **self.base_settings(),
            "primary_conninfo": self.original_conninfo,
            "primary_slot_name": self.slot_name,
            # Default 5s: reconnecting after cut_off()/a primary restart would be slow.
            "wal_retrieve_retry_interval": "1s",
        }

    def replay_pause_state(self) -> str:
        """'not paused', 'pause requested' or 'paused'."""
        if self.binaries.major >= 14:
            return str(self.scalar("SELECT pg_get_wal_replay_pause_state()"))
        return "paused" if self.scalar("SELECT pg_is_wal_replay_paused()") else "not paused"

    def pause_replay(self, *, wait: bool = True, timeout: float = 10) -> None:
        """pg_wal_replay_pause(); by default wait until the server reports 'paused'."""
        self.execute("SELECT pg_wal_replay_pause()")
        if not wait:
            return

        def paused() -> bool:
            state = self.replay_pause_state()
            if state == "paused":
                return True
            # While sleeping for recovery_min_apply_delay the startup process does not
            # confirm a pause until the delay ends: "requested" is all we can get.
            delayed = self.scalar("SELECT current_setting('recovery_min_apply_delay') <> '0'")
            return state == "pause requested" and bool(delayed)

        if not wait_until(paused, timeout):
            raise RuntimeError(f"{self.name}: replay not paused after {timeout}s")

    def resume_replay(self) -> None:
        # On a hot standby even this statement can be cancelled by a recovery conflict
        # (replay removing row versions its snapshot might need): try again.
        for attempt in range(5):
            try:
                self.execute("SELECT pg_wal_replay_resume()")
                return
            except psycopg.errors.SerializationFailure:
                if attempt == 4:
                    raise
                time.sleep(0.1)

    def set_apply_delay(self, seconds: float) -> None:
        """recovery_min_apply_delay via ALTER SYSTEM + reload; 0 resets it."""
        ms = round(seconds * 1000)
        self.alter_system("recovery_min_apply_delay", f"{ms}ms" if ms > 0 else None)
        self.reload()

# --------------------------------------------------------------------------- cluster
