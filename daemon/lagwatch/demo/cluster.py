"""A real local PostgreSQL cluster for the demo and the tests: a primary with streaming
replicas on loopback, started as the server user and removed on exit (servers.py has one
server's life)."""

from __future__ import annotations

import atexit
import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self, TypeVar

import psycopg

from lagwatch.demo.binaries import PgBinaries, mkdir_owned, run_as_server_user, write_owned
from lagwatch.demo.ports import free_port, port_free
from lagwatch.demo.servers import (
    INACTIVE_SLOT,
    PRIMARY_HOST,
    SUPERUSER,
    LocalReplica,
    LocalServer,
    conf_lines,
    proc_state,
    remaining,
    wait_until,
)

_T = TypeVar("_T")


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
            self._initdb_primary(remaining(deadline))
            self.primary.start(remaining(deadline))
            self._create_slots()
            self.create_extensions()
            # Replicas are independent: basebackup + start them concurrently.
            self._parallel(lambda r: self._build_replica(r, deadline), self.replicas)
            self.wait_streaming(remaining(deadline))
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop()  # no half-started servers left running; cleanup() removes files
            raise
        self._started = True
        return self

    def create_extensions(self) -> None:
        """What lagwatch reads when it is there: pg_walinspect (15+; absent in some builds)."""
        with contextlib.suppress(psycopg.Error):
            self.primary.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")

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
        # --no-instructions is 14+ (it only drops the "start the server with" hint).
        quiet = ["--no-instructions"] if self.binaries.major >= 14 else []
        r = run_as_server_user(
            [self.binaries.tool("initdb"), "-D", p.datadir, "-U", SUPERUSER, "-A", "trust",
             "-E", "UTF8", "--locale=C", "-N", *quiet],
            cwd=p.folder, timeout=timeout,
        )  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        conf = p.datadir / "postgresql.conf"
        with conf.open("a") as f:
            f.write("\n# --- lagwatch.demo.cluster ---\n" + conf_lines(self.primary_settings()))
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
            cwd=r.folder, timeout=remaining(deadline, 5),
        )  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"pg_basebackup for {r.name} failed:\n{res.stdout}{res.stderr}")
        # -R wrote primary_conninfo/primary_slot_name; replace the whole file with ours.
        r.auto_conf = r.replica_settings()
        write_owned(
            r.datadir / "postgresql.auto.conf",
            "# Do not edit this file manually!\n"
            "# It will be overwritten by the ALTER SYSTEM command.\n" + conf_lines(r.auto_conf),
        )
        if not (r.datadir / "standby.signal").exists():
            write_owned(r.datadir / "standby.signal", "")
        r.start(remaining(deadline))

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

        if not wait_until(ok, timeout, 0.1):
            logs = "\n".join(f"--- {r.name} ---\n{r.log_tail(15)}" for r in self.replicas)
            raise RuntimeError(
                f"replicas not streaming after {timeout}s; pg_stat_replication={last}\n{logs}"
            )

    def wait_replayed(self, timeout: float = 30) -> None:
        """Until every running, non-frozen replica has replayed the primary's flushed WAL."""
        target = str(self.primary.scalar("SELECT pg_current_wal_flush_lsn()"))
        for r in self.replicas:
            if not r.is_running() or proc_state(r.postmaster_pid() or 0) in ("T", "t"):
                continue

            def caught_up(r: LocalReplica = r) -> bool:
                return bool(
                    r.scalar("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))
                )

            if not wait_until(caught_up, timeout):
                got = r.scalar("SELECT pg_last_wal_replay_lsn()")
                raise RuntimeError(f"{r.name} replayed {got}, not {target} after {timeout}s")

    @staticmethod
    def _parallel(fn: Callable[[_T], None], items: Sequence[_T]) -> None:
        if not items:
            return
        with ThreadPoolExecutor(max_workers=len(items)) as pool:
            for fut in [pool.submit(fn, item) for item in items]:
                fut.result()

