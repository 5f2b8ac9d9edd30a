"""Test clusters that can be frozen, cut off, promoted and healed.

The servers themselves (binaries, initdb, start, stop, replicas) are lagwatch's own
(lagwatch.demo.cluster, which ``lagwatch demo`` needs); what only tests do to them lives
here, so the package ships none of it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Self

import failure_logs
import psycopg
from lagwatch.demo.cluster import LocalCluster
from lagwatch.demo.servers import SUPERUSER, LocalReplica, LocalServer, proc_state, remaining, signal_pid, wait_until
from psycopg import sql as pgsql


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) for every process, from /proc."""
    out: dict[int, tuple[int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                data = f.read()
        except OSError:
            continue
        # comm may contain spaces and parentheses: split after the last ')'.
        fields = data[data.rfind(")") + 2 :].split()
        if len(fields) >= 2:
            out[int(entry.name)] = (int(fields[1]), fields[0])
    return out


def _descendants(root: int, table: dict[int, tuple[int, str]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(out)



def _remove_sysv_shm(shmid: int) -> None:
    # After SIGKILL nobody marks PostgreSQL's small SysV segment for removal; without this
    # every killed server leaks one (and kernel.shmmni is finite).
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        ipc_rmid = 0
        libc.shmctl(ctypes.c_int(shmid), ctypes.c_int(ipc_rmid), None)


class _Chaos:
    """What tests do to any server (a mixin for LocalServer and LocalReplica): freeze it
    like a hung host, kill it like a crash (children and shared memory too), restart it,
    and put its ALTER SYSTEM settings back."""

    def pids(self) -> list[int]:
        """Postmaster PID followed by all its descendants."""
        pm = self.postmaster_pid()
        if pm is None:
            return []
        return [pm, *_descendants(pm, _proc_table())]


    def _kill(self, pm: int) -> None:
        shmid = self._shmid()
        children = _descendants(pm, _proc_table())
        signal_pid(pm, signal.SIGKILL)
        # Orphaned children would exit on their own once they notice, but
        # they are ours (children of our postmaster) so don't wait for that.
        for pid in children:
            signal_pid(pid, signal.SIGKILL)
        # Wait until reaped, not just dead: PostgreSQL's lock-file check is kill(pid, 0),
        # which succeeds on a zombie and would make the next start fail.
        wait_until(lambda: not any(proc_state(p) for p in (pm, *children)), 10)
        # The dead postmaster could not remove its lock files; they're ours to remove.
        stale = [self.datadir / "postmaster.pid", *self.socket_dir.glob(".s.PGSQL.*")]
        for path in stale:
            with contextlib.suppress(OSError):
                path.unlink()
        if shmid is not None:
            _remove_sysv_shm(shmid)

    def _shmid(self) -> int | None:
        try:
            line = (self.datadir / "postmaster.pid").read_text().splitlines()[6]
            return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def is_frozen(self) -> bool:
        pm = self.postmaster_pid()
        return pm is not None and proc_state(pm) in ("T", "t")

    def freeze(self) -> None:
        """SIGSTOP the postmaster and all its children, like a hung host."""
        pm = self.postmaster_pid()
        if pm is None:
            raise RuntimeError(f"{self.name} is not running")
        # Postmaster first so it cannot fork new children while we stop the others.
        signal_pid(pm, signal.SIGSTOP)
        pids = self.pids()
        for pid in pids[1:]:
            signal_pid(pid, signal.SIGSTOP)

        def all_stopped() -> bool:
            return all(proc_state(p) in (None, "T", "t", "Z", "X") for p in pids)

        wait_until(all_stopped, 2.0, 0.01)

    def thaw(self) -> None:
        """SIGCONT everything freeze() stopped (harmless when not frozen)."""
        pids = self.pids()
        for pid in pids[1:]:
            signal_pid(pid, signal.SIGCONT)
        if pids:
            signal_pid(pids[0], signal.SIGCONT)

    def restart(self, timeout: float = 30) -> None:
        self.stop()
        self.start(timeout)

    def file_auto_conf(self) -> dict[str, str]:
        """What postgresql.auto.conf currently says, as the server parses it."""
        rows = self.execute(
            "SELECT name, setting FROM pg_file_settings "
            "WHERE sourcefile LIKE '%postgresql.auto.conf' ORDER BY seqno"
        )
        return {str(n): str(s) for n, s in rows}

    def restore_auto_conf(self, timeout: float = 30) -> bool:
        """Undo ALTER SYSTEM changes made since setup; restarts if a change needs it."""
        if self.file_auto_conf() == self.auto_conf:
            return False
        self.execute("ALTER SYSTEM RESET ALL")
        for k, v in self.auto_conf.items():
            self.alter_system(k, v)
        self.reload()
        if self.execute("SELECT 1 FROM pg_settings WHERE pending_restart"):
            self.restart(timeout)
        return True


class ChaosServer(_Chaos, LocalServer):
    def stop(self, mode: str = "fast", timeout: float = 30) -> None:
        self.thaw()  # a stopped process can't shut down
        LocalServer.stop(self, mode, timeout)


class ChaosReplica(_Chaos, LocalReplica):
    """A replica that can also be cut off from its primary, reconnected and promoted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        LocalReplica.__init__(self, *args, **kwargs)
        # Bound but never listening: connections to it are refused, and nobody else
        # (e.g. a parallel cluster's new primary) can grab the port while we're cut off.
        self._dead_socket: socket.socket | None = None

    def stop(self, mode: str = "fast", timeout: float = 30) -> None:
        self.thaw()
        LocalReplica.stop(self, mode, timeout)

    def set_primary_conninfo(self, conninfo: str) -> None:
        """ALTER SYSTEM SET primary_conninfo + reload (the walreceiver restarts, PG13+)."""
        self.alter_system("primary_conninfo", conninfo)
        self.reload()

    def is_streaming(self) -> bool:
        """Whether this replica's walreceiver is currently streaming."""
        return bool(
            self.scalar("SELECT count(*) > 0 FROM pg_stat_wal_receiver WHERE status = 'streaming'")
        )

    def cut_off(self, *, wait: bool = True, timeout: float = 15) -> None:
        """Point primary_conninfo at a loopback port nothing listens on."""
        if self._dead_socket is None:
            self._dead_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._dead_socket.bind((self.primary.host, 0))
        dead: int = self._dead_socket.getsockname()[1]
        self.set_primary_conninfo(
            f"host={self.primary.host} port={dead} user={SUPERUSER} "
            f"application_name={self.application_name}"
        )
        if wait and not wait_until(lambda: not self.is_streaming(), timeout):
            raise RuntimeError(f"{self.name}: still streaming {timeout}s after cut_off()")

    def reconnect(self, *, wait: bool = False, timeout: float = 30) -> None:
        """Restore the original primary_conninfo (optionally wait until streaming again)."""
        self.set_primary_conninfo(self.original_conninfo)
        self.release_dead_port()
        if wait and not wait_until(self.is_streaming, timeout, 0.1):
            raise RuntimeError(
                f"{self.name}: not streaming {timeout}s after reconnect()\n"
                f"--- tail of {self.log_file} ---\n{self.log_tail()}"
            )

    def release_dead_port(self) -> None:
        """Close the socket reserving cut_off()'s dead port (reconnect/heal do this)."""
        if self._dead_socket is not None:
            self._dead_socket.close()
            self._dead_socket = None

    def promote(self, timeout: float = 30) -> None:
        """pg_promote(); LocalCluster.heal() rebuilds a promoted replica."""
        self.execute("SELECT pg_promote(true, %s)", (max(1, int(timeout)),))


class ChaosCluster(LocalCluster):
    """A LocalCluster whose servers can be frozen, cut off and promoted, and healed."""

    server_class = ChaosServer
    replica_class = ChaosReplica
    primary: ChaosServer
    replicas: list[ChaosReplica]

    def start(self, timeout: float = 60) -> Self:
        for s in self.servers:
            failure_logs.watch(s, f"{s.name} (pg{self.binaries.major}) {s.log_file}", s.log_tail)
        self.archive_flags.mkdir(mode=0o755, exist_ok=True)  # read by the server's user
        return super().start(timeout)

    @property
    def archive_flags(self) -> Path:
        """Where a test steers the primary's archive_command: a file ``fail`` makes it fail,
        a file ``delay`` holding seconds makes it take that long (heal removes both)."""
        return self.base_dir / "archive-flags"

    def primary_settings(self) -> dict[str, str]:
        """As a LocalCluster's, and archiving WAL (archive_mode needs a restart, so it is on
        from the start) through a command the flag files steer; it keeps nothing (the WAL
        it "archives" is not copied anywhere). The replicas, cloned with it, have
        archive_mode on, which on a standby does not archive."""
        flags = self.archive_flags
        return {**super().primary_settings(), "archive_mode": "on",
                "archive_command": f'test ! -e "{flags}/fail" && sleep "$(cat "{flags}/delay" 2>/dev/null || echo 0)"'}

    def clear_archive_flags(self) -> None:
        for name in ("fail", "delay"):
            (self.archive_flags / name).unlink(missing_ok=True)

    def stop(self) -> None:
        for s in self.servers:  # thaw all first: a frozen peer can stall a shutdown
            with contextlib.suppress(OSError):
                s.thaw()
        super().stop()

    def cleanup(self) -> None:
        for s in self.servers:
            failure_logs.unwatch(s)
        try:
            super().cleanup()
        finally:
            for r in self.replicas:
                r.release_dead_port()

    def _ensure_slots(self) -> set[str]:
        """Create missing slots; recreate lost ones. Returns the names recreated/created."""
        rows = self.primary.execute(
            "SELECT slot_name, wal_status = 'lost', active FROM pg_replication_slots"
        )
        have = {str(name): (bool(lost), bool(active)) for name, lost, active in rows}
        changed: set[str] = set()
        for slot in self.slot_names:
            if slot in have:
                lost, active = have[slot]
                if not lost:
                    continue
                if active:
                    continue  # caller must stop the user first (see heal)
                self.primary.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            self.primary.execute("SELECT pg_create_physical_replication_slot(%s, true)", (slot,))
            changed.add(slot)
        return changed

    def rebuild_replica(self, replica: LocalReplica, timeout: float = 60) -> None:
        """Throw a replica away and re-clone it from the primary (e.g. after promotion)."""
        deadline = time.monotonic() + timeout
        replica.stop()

        def slot_released() -> bool:
            return not self.primary.execute(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active",
                (replica.slot_name,),
            )

        wait_until(slot_released, remaining(deadline))
        self._ensure_slots()
        self._build_replica(replica, deadline)

    # -- repair

    def reset(self, timeout: float = 60) -> None:
        """Put a cluster one test module used back to as new for the next (the suite shares
        one cluster per major between modules, conftest.py): healed, then everything a
        module may leave on the primary gone. The ``postgres`` database is dropped and made
        again from template1 (tables, schemas, extensions such as pg_walinspect, functions,
        publications: one statement, not a list of kinds to keep up to date); databases,
        roles and slots the tests made are dropped; the inactive slot is made again, so the
        WAL it retains starts now, not at the start of the run."""
        deadline = time.monotonic() + timeout
        self.heal(remaining(deadline))
        keep_slots = [r.slot_name for r in self.replicas]
        with psycopg.connect(self.primary.dsn("template1"), autocommit=True, connect_timeout=5) as conn:
            for pid, in conn.execute("SELECT active_pid FROM pg_replication_slots "
                                     "WHERE active_pid IS NOT NULL AND slot_name <> ALL(%s)", (keep_slots,)):
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name <> ALL(%s)",
                                        (keep_slots,)).fetchall():
                wait_until(lambda s=slot: not conn.execute(
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", (s,)).fetchall(),
                    remaining(deadline))
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            for (name,) in conn.execute("SELECT datname FROM pg_database "
                                        "WHERE datname NOT IN ('template0', 'template1')").fetchall():
                conn.execute(pgsql.SQL("DROP DATABASE {} WITH (FORCE)").format(pgsql.Identifier(name)))
            conn.execute("CREATE DATABASE postgres")
            for (role,) in conn.execute("SELECT rolname FROM pg_roles WHERE rolname !~ '^pg_' AND rolname <> %s",
                                        (SUPERUSER,)).fetchall():
                conn.execute(pgsql.SQL("DROP OWNED BY {}").format(pgsql.Identifier(role)))
                conn.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))
            conn.execute(pgsql.SQL("ALTER ROLE {} RESET ALL").format(pgsql.Identifier(SUPERUSER)))
            target = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]  # type: ignore[index]
        # The replicas have the new database before anyone connects to it there (through
        # template1: until they replay the CREATE, "postgres" does not exist on them).
        for r in self.replicas:
            def replayed(r: LocalReplica = r) -> bool:
                with psycopg.connect(r.dsn("template1"), autocommit=True, connect_timeout=5) as rc:
                    row = rc.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)).fetchone()
                    return bool(row and row[0])
            if not wait_until(replayed, remaining(deadline), 0.02):
                raise RuntimeError(f"{r.name}: the reset's WAL not replayed within {timeout}s")
        self._ensure_slots()
        self.create_extensions()
        self.wait_replayed(remaining(deadline))


    def heal(self, timeout: float = 60) -> None:
        """Undo what tests do: thaw, start, resume, reconnect, reset ALTER SYSTEM, re-clone."""
        deadline = time.monotonic() + timeout
        self.clear_archive_flags()
        for s in self.servers:
            s.thaw()
        self.primary.start(remaining(deadline))
        self.primary.restore_auto_conf(remaining(deadline))
        lost = {
            str(name)
            for (name,) in self.primary.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE wal_status = 'lost'"
            )
        }
        self._ensure_slots()  # recreates missing ones; lost+active ones after rebuild below
        for r in self.replicas:
            rebuild = r.slot_name in lost
            if not rebuild and not r.is_running():
                try:
                    r.start(remaining(deadline))
                except RuntimeError:
                    rebuild = True
            if not rebuild and not r.scalar("SELECT pg_is_in_recovery()"):
                rebuild = True  # promoted
            if rebuild:
                self.rebuild_replica(r, remaining(deadline))
                continue
            if r.replay_pause_state() != "not paused":
                r.resume_replay()
            r.restore_auto_conf(remaining(deadline))
        for r in self.replicas:  # conninfo no longer points at them
            r.release_dead_port()
        self.wait_streaming(remaining(deadline))
        self.wait_replayed(remaining(deadline))
