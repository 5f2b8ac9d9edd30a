"""Real local PostgreSQL streaming-replication clusters, for ``lagwatch demo`` (and, with
what only tests do to them, tests/integration/chaoscluster.py).

Everything here binds to loopback only and only ever signals a postmaster it started
itself (the PID in ``postmaster.pid``, checked against its data directory), never a
process found by name. When lagwatch runs as root the servers run as an unprivileged
user (``lagwatch.pgbinaries``), since PostgreSQL refuses to run as root.

Deliberately free of any pytest dependency: stdlib + psycopg only.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self, TypeVar

import psycopg
from psycopg import sql as pgsql

from lagwatch.pgbinaries import PgBinaries, mkdir_owned, run_as_server_user, write_owned
from lagwatch.ports import free_port, port_free

__all__ = ["INACTIVE_SLOT", "LocalCluster", "LocalReplica", "LocalServer"]

PRIMARY_HOST = "127.0.0.1"
SUPERUSER = "postgres"
INACTIVE_SLOT = "inactive"
_POLL = 0.05

_T = TypeVar("_T")


# --------------------------------------------------------------------------- helpers


def _quote_conf(value: str) -> str:
    """Quote a value the way postgresql.conf / ALTER SYSTEM do."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _conf_lines(settings: dict[str, str]) -> str:
    return "".join(f"{k} = {_quote_conf(v)}\n" for k, v in settings.items())


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"<no log: {e}>"
    return "\n".join(text.splitlines()[-lines:])


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(")") + 2 :].split()[0]


def _alive(pid: int) -> bool:
    # Zombies count as dead: in containers PID 1 may never reap a reparented postmaster.
    return _proc_state(pid) not in (None, "Z", "X")


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_until(pred: Callable[[], bool], timeout: float, interval: float = _POLL) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _remaining(deadline: float, minimum: float = 1.0) -> float:
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
        _signal(pm, signal.SIGKILL)
        _wait_until(lambda: _proc_state(pm) is None, 10)  # reaped, not just dead (see _alive)
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

        if not _wait_until(paused, timeout):
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


class LocalCluster:
    """Primary on 127.0.0.1 plus N streaming replicas on 127.0.0.2.., all on one port.

    Use ``with LocalCluster(find_binaries(), 2) as c:`` (starts, cleans up on exit) or
    call ``start()`` / ``cleanup()`` yourself.  Files live in a fresh
    ``lagwatch-cluster-*`` temp dir (created inside ``base_dir`` if given).
    """

    server_class: type[LocalServer] = LocalServer
    replica_class: type[LocalReplica] = LocalReplica

    def __init__(self, binaries: PgBinaries, replicas: int = 2, *, base_dir: Path | None = None):
        if not 0 <= replicas <= 20:
            raise ValueError("replicas must be between 0 and 20")
        hosts = [f"127.0.0.{i + 2}" for i in range(replicas)]
        self.binaries = binaries
        self._started = False
        self._cleaned = False
        self.base_dir = Path(
            tempfile.mkdtemp(prefix="lagwatch-cluster-", dir=str(base_dir) if base_dir else None)
        )
        # Registered now (not at start) so the temp dir is removed even if start() never runs.
        atexit.register(self._atexit)
        mkdir_owned(self.base_dir, 0o755)
        pport = free_port([PRIMARY_HOST])
        rport = free_port(hosts, exclude={pport}) if hosts else 0
        self.primary = self.server_class(
            "primary", PRIMARY_HOST, pport, self.base_dir / "primary" / "data", binaries
        )
        self.replicas = [
            self.replica_class(
                f"replica{i}",
                h,
                rport,
                self.base_dir / f"replica{i}" / "data",
                binaries,
                self.primary,
            )
            for i, h in enumerate(hosts, start=1)
        ]
        for s in self.servers:
            mkdir_owned(s.folder, 0o755)

    def __repr__(self) -> str:
        return f"<LocalCluster pg{self.binaries.major} {self.servers} in {self.base_dir}>"

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    @property
    def servers(self) -> list[LocalServer]:
        return [self.primary, *self.replicas]

    @property
    def slot_names(self) -> list[str]:
        return [r.slot_name for r in self.replicas] + [INACTIVE_SLOT]

    def primary_settings(self) -> dict[str, str]:
        return {
            **self.primary.base_settings(),
            "wal_level": "replica",
            "max_wal_senders": "10",
            "max_replication_slots": "10",
            "hot_standby": "on",
            "fsync": "off",  # speed; these clusters are throwaway
            "full_page_writes": "on",
            "shared_buffers": "32MB",
            "max_connections": "50",
            "logging_collector": "off",
            "wal_keep_size": "0",
            "max_slot_wal_keep_size": "1GB",
            "checkpoint_timeout": "5min",
        }

    # -- lifecycle

    def start(self, timeout: float = 60) -> Self:
        """initdb + start the primary, create slots, basebackup + start replicas, wait streaming."""
        if self._cleaned:
            raise RuntimeError("cluster was cleaned up; create a new one")
        if self._started:
            return self
        deadline = time.monotonic() + timeout
        try:
            self._repick_ports()
            self._initdb_primary(_remaining(deadline))
            self.primary.start(_remaining(deadline))
            self._create_slots()
            with contextlib.suppress(psycopg.Error):  # pg_walinspect: PG15+, may be absent
                self.primary.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            # Replicas are independent: basebackup + start them concurrently.
            self._parallel(lambda r: self._build_replica(r, deadline), self.replicas)
            self.wait_streaming(_remaining(deadline))
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop()  # no half-started servers left running; cleanup() removes files
            raise
        self._started = True
        return self

    def _repick_ports(self) -> None:
        # Ports were chosen in __init__; re-pick if something grabbed them since.
        if not port_free(PRIMARY_HOST, self.primary.port):
            self.primary.port = free_port([PRIMARY_HOST])
        hosts = [r.host for r in self.replicas]
        if hosts and not all(port_free(h, self.replicas[0].port) for h in hosts):
            port = free_port(hosts, exclude={self.primary.port})
            for r in self.replicas:
                r.port = port

    def _initdb_primary(self, timeout: float) -> None:
        p = self.primary
        r = run_as_server_user(
            [self.binaries.tool("initdb"), "-D", p.datadir, "-U", SUPERUSER, "-A", "trust",
             "-E", "UTF8", "--locale=C", "-N", "--no-instructions"],
            cwd=p.folder, timeout=timeout,
        )  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        conf = p.datadir / "postgresql.conf"
        with conf.open("a") as f:
            f.write("\n# --- lagwatch.localcluster ---\n" + _conf_lines(self.primary_settings()))
        write_owned(
            p.datadir / "pg_hba.conf",
            "local all all trust\n"
            "local replication all trust\n"
            "host all all 127.0.0.0/8 trust\n"
            "host replication all 127.0.0.0/8 trust\n",
        )
        p.auto_conf = {}

    def _create_slots(self) -> None:
        for slot in self.slot_names:
            self.primary.execute("SELECT pg_create_physical_replication_slot(%s, true)", (slot,))

    def _build_replica(self, r: LocalReplica, deadline: float) -> None:
        """pg_basebackup into r.datadir, write its auto.conf, start it."""
        if r.datadir.exists():
            shutil.rmtree(r.datadir)
        res = run_as_server_user(
            [self.binaries.tool("pg_basebackup"), "-h", self.primary.host,
             "-p", str(self.primary.port), "-U", SUPERUSER, "-D", r.datadir,
             "-X", "stream", "-S", r.slot_name, "-R", "-c", "fast", "-N", "-w"],
            cwd=r.folder, timeout=_remaining(deadline, 5),
        )  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"pg_basebackup for {r.name} failed:\n{res.stdout}{res.stderr}")
        # -R wrote primary_conninfo/primary_slot_name; replace the whole file with ours.
        r.auto_conf = r.replica_settings()
        write_owned(
            r.datadir / "postgresql.auto.conf",
            "# Do not edit this file manually!\n"
            "# It will be overwritten by the ALTER SYSTEM command.\n" + _conf_lines(r.auto_conf),
        )
        if not (r.datadir / "standby.signal").exists():
            write_owned(r.datadir / "standby.signal", "")
        r.start(_remaining(deadline))

    def stop(self) -> None:
        """Stop all servers, replicas first; idempotent."""
        errors: list[BaseException] = []
        for s in [*self.replicas, self.primary]:
            try:
                s.stop()
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                # keep going: stop the others anyway
                errors.append(e)
        if errors:
            raise RuntimeError(f"errors while stopping cluster: {errors}")

    def cleanup(self) -> None:
        """stop() + remove the base dir; safe to call repeatedly and after failed starts."""
        if self._cleaned:
            return
        try:
            self.stop()
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self._cleaned = True
            self._started = False
            atexit.unregister(self._atexit)

    def _atexit(self) -> None:
        with contextlib.suppress(Exception):
            self.cleanup()

    # -- waiting

    def wait_streaming(self, timeout: float = 30) -> None:
        """Until every replica shows as 'streaming' in the primary's pg_stat_replication."""
        want = {r.application_name for r in self.replicas}
        last: list[tuple[Any, ...]] = []

        def ok() -> bool:
            nonlocal last
            try:
                last = self.primary.execute(
                    "SELECT application_name, state FROM pg_stat_replication"
                )
            except psycopg.OperationalError:
                return False
            return want <= {str(a) for a, s in last if s == "streaming"}

        if not _wait_until(ok, timeout, 0.1):
            logs = "\n".join(f"--- {r.name} ---\n{r.log_tail(15)}" for r in self.replicas)
            raise RuntimeError(
                f"replicas not streaming after {timeout}s; pg_stat_replication={last}\n{logs}"
            )

    def wait_replayed(self, timeout: float = 30) -> None:
        """Until every running, non-frozen replica has replayed the primary's flushed WAL."""
        target = str(self.primary.scalar("SELECT pg_current_wal_flush_lsn()"))
        for r in self.replicas:
            if not r.is_running() or _proc_state(r.postmaster_pid() or 0) in ("T", "t"):
                continue

            def caught_up(r: LocalReplica = r) -> bool:
                return bool(
                    r.scalar("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))
                )

            if not _wait_until(caught_up, timeout):
                got = r.scalar("SELECT pg_last_wal_replay_lsn()")
                raise RuntimeError(f"{r.name} replayed {got}, not {target} after {timeout}s")

    @staticmethod
    def _parallel(fn: Callable[[_T], None], items: Sequence[_T]) -> None:
        if not items:
            return
        with ThreadPoolExecutor(max_workers=len(items)) as pool:
            for fut in [pool.submit(fn, item) for item in items]:
                fut.result()

