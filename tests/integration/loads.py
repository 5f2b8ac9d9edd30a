"""Realistic load for the field tests and benches: an OLTP stream (pgbench's TPC-B-like
transactions at a Poisson rate, several clients), one big transaction amid it, replay held
in short bursts, and CPU-bound neighbours that make the host busy. Each is bounded in time
and stops by itself; each is stopped by the PID it started."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from chaoscluster import ChaosCluster, ChaosReplica
from harness import cluster_config
from lagwatch.demo.ports import free_port
from pgbouncer_server import PgBouncerServer

# pgbench's tables at scale 1 (100,000 accounts): what TPC-B-like transactions touch.
PGBENCH_SCALE = 1
BIG_TABLE = "lagwatch_big"


ROOT = Path(__file__).resolve().parents[2]


def create_heartbeat_table(cluster: ChaosCluster, schema: str | None = None) -> None:
    """The heartbeat table as deploy/sql/lagwatch-heartbeat.sql makes it, run by psql as
    an operator would (its grants to a NOLOGIN ``lagwatch`` role made here if missing: the
    tests' login is a superuser), in ``schema`` (the script's default, public, if None)."""
    cluster.primary.execute("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lagwatch') "
                            "THEN CREATE ROLE lagwatch NOLOGIN; END IF; END $$")
    primary = cluster.primary
    subprocess.run([str(cluster.binaries.tool("psql")), "-X", "-q", "-h", primary.host, "-p", str(primary.port),
                    "-U", "postgres", "-d", "postgres", *(["-v", f"schema={schema}"] if schema else []),
                    "-f", str(ROOT / "deploy" / "sql" / "lagwatch-heartbeat.sql")],
                   check=True, capture_output=True, timeout=60)


def heartbeat_config(cluster: ChaosCluster, *, interval: str = "1s", window: str = "1m",
                     **cluster_keys: Any) -> dict[str, Any]:
    """A config watching ``cluster`` on a free port, its one cluster's entry with
    ``cluster_keys`` (a heartbeat, lag_from_wal...)."""
    config = cluster_config(cluster, free_port(["127.0.0.1"]), interval=interval, window=window)
    config["clusters"][0].update(cluster_keys)
    return config


def heartbeat_sessions(cluster: ChaosCluster) -> int:
    """lagwatch's heartbeat writer's sessions on the primary (of the cluster named main)."""
    return int(cluster.primary.scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                                      "'lagwatch/main/heartbeat'"))


def prepare(cluster: ChaosCluster, big_rows: int = 0) -> None:
    """pgbench's tables (once), and a table of ``big_rows`` rows for the big transaction."""
    subprocess.run([str(cluster.binaries.tool("pgbench")), "-i", "-q", "-s", str(PGBENCH_SCALE), "-h",
                    cluster.primary.host, "-p", str(cluster.primary.port), "-U", "postgres", "postgres"],
                   check=True, capture_output=True, timeout=120)
    if big_rows:
        create_big_table(cluster, big_rows)
    cluster.wait_replayed()


def create_big_table(cluster: ChaosCluster, rows: int) -> None:
    """The table the big transaction updates whole (big_update), afresh, replayed everywhere."""
    cluster.primary.execute(f"DROP TABLE IF EXISTS {BIG_TABLE}")
    cluster.primary.execute(f"CREATE TABLE {BIG_TABLE} (id int PRIMARY KEY, v int NOT NULL) "
                            "WITH (autovacuum_enabled = off)")
    cluster.primary.execute(f"INSERT INTO {BIG_TABLE} SELECT g, 0 FROM generate_series(1, {rows}) g")
    cluster.wait_replayed(timeout=120)


class Pgbench:
    """pgbench on the primary, a progress line a second, for at most ``seconds``, stopped by
    its PID: TPC-B-like by default, or ``script`` (one transaction's SQL); at ``rate``
    transactions a second on a Poisson schedule (pgbench --rate), or as fast as it goes.
    ``options``: PGOPTIONS for its sessions."""

    def __init__(self, cluster: ChaosCluster, workdir: Path, *, clients: int = 4, seconds: int = 120,
                 rate: float | None = None, script: str | None = None, options: str = "") -> None:
        self.log = workdir / "pgbench.log"
        args = [str(cluster.binaries.tool("pgbench")), "-n", "-h", cluster.primary.host, "-p",
                str(cluster.primary.port), "-U", "postgres", "-c", str(clients), "-T", str(seconds), "-P", "1"]
        if rate is not None:
            args += ["-j", "1", "-R", str(rate)]
        if script is not None:
            (workdir / "script.sql").write_text(script)
            args += ["-f", str(workdir / "script.sql")]
        self.proc = subprocess.Popen([*args, "postgres"], stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     env={**os.environ, **({"PGOPTIONS": options} if options else {})})

    def __enter__(self) -> Pgbench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def progress(self) -> list[float]:
        """Transactions per second, one figure per progress line so far."""
        return [float(m.group(1)) for m in re.finditer(r"progress: [\d.]+ s, ([\d.]+) tps", self.log.read_text())]

    def stop(self) -> str:
        # SIGTERM, not SIGINT: a pgbench started from a shell's background job (a CI runner
        # may start one so) ignores SIGINT, and each stop waited out the 10 s below. Either
        # ends it without its summary; the progress lines are what the tests read.
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.log.read_text()


def create_read_table(cluster: ChaosCluster) -> str:
    """A small table for PoolReads to read (no ``pgbench -i``: 100,000 rows for replicas to
    replay, where 1,000 prove the same), replayed everywhere; its name."""
    cluster.primary.execute("CREATE TABLE IF NOT EXISTS pool_reads AS SELECT g AS id FROM generate_series(1, 1000) g")
    cluster.wait_replayed()
    return "pool_reads"


_PROGRESS = re.compile(r"^progress: [\d.]+ s, ([\d.]+) tps, .*?(\d+) failed", re.M)


class PoolReads:
    """pgbench reading through PgBouncer's app_ro (2 clients, 40 transactions/s, one
    connection each for the whole run, progress every second) from before the first pool
    change until the test stops it after the last: as long as the test takes, not a
    guessed -T it must then wait out. A client that meets an error aborts and says so (and
    pgbench ends once none is left): the log must show none."""

    def __init__(self, cluster: ChaosCluster, pgbouncer: PgBouncerServer, table: str, folder: Path) -> None:
        script = folder / "read.sql"
        script.write_text(f"\\set id random(1, 1000)\nSELECT id FROM {table} WHERE id = :id;\n")
        self.log = folder / "pgbench.log"
        self.proc = subprocess.Popen(
            [str(cluster.binaries.tool("pgbench")), "-h", "127.0.0.1", "-p", str(pgbouncer.port), "-U", "postgres",
             "-n", "-f", str(script), "-c", "2", "-R", "40", "-T", "600", "-P", "1", "app_ro"],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT, text=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def progress(self) -> list[tuple[float, int]]:
        """(transactions per second, failed) of each progress report so far."""
        return [(float(tps), int(failed)) for tps, failed in _PROGRESS.findall(self.output())]

    def wait_reads_after(self, reports: int, timeout: float = 20) -> None:
        """Wait for a report of transactions made after the ``reports``-th report was
        printed: the first report after it also covers time before it, the second does not."""
        deadline = time.monotonic() + timeout
        while not any(tps > 0 for tps, _ in self.progress()[reports + 1:]):
            assert self.proc.poll() is None, f"pgbench ended ({self.proc.returncode}):\n{self.output()}"
            assert time.monotonic() < deadline, f"no pgbench reads reported in {timeout}s:\n{self.output()}"
            time.sleep(0.05)

    def stop(self) -> str:
        """Stop it (it must still be running: pgbench ends early only when every client
        aborted) and return its output."""
        assert self.proc.poll() is None, f"pgbench ended ({self.proc.returncode}):\n{self.output()}"
        # SIGTERM, not SIGINT: a run started from a background job (nohup, a CI runner's
        # script) inherits SIGINT ignored, and pgbench then ran on (a fresh-clone run failed
        # so, after 10 s).
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(10) == -signal.SIGTERM
        return self.output()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Oltp(Pgbench):
    """The OLTP stream: pgbench TPC-B-like at ``rate`` transactions a second over
    ``clients`` connections, scheduled as a Poisson process, for at most ``seconds``."""

    def __init__(self, cluster: ChaosCluster, workdir: Path, *, rate: float = 150, clients: int = 4,
                 seconds: int = 120) -> None:
        super().__init__(cluster, workdir, clients=clients, seconds=seconds, rate=rate)


def big_update(cluster: ChaosCluster) -> float:
    """One UPDATE of every row of the big table, in one transaction; returns its seconds."""
    started = time.monotonic()
    cluster.primary.execute(f"UPDATE {BIG_TABLE} SET v = v + 1")
    return time.monotonic() - started


class ReplayBursts:
    """Holds a replica's replay in short bursts (paused ``hold`` seconds, then running
    ``run`` seconds) from a thread, for at most ``seconds``; resumed on exit."""

    def __init__(self, replica: ChaosReplica, *, hold: float = 0.04, run: float = 0.03, seconds: float = 60) -> None:
        self.replica, self.hold, self.run, self.seconds = replica, hold, run, seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import psycopg

        deadline = time.monotonic() + self.seconds
        with psycopg.connect(self.replica.dsn(), autocommit=True) as conn:
            try:
                while not self._stop.is_set() and time.monotonic() < deadline:
                    conn.execute("SELECT pg_wal_replay_pause()")
                    self._stop.wait(self.hold)
                    conn.execute("SELECT pg_wal_replay_resume()")
                    self._stop.wait(self.run)
            finally:
                conn.execute("SELECT pg_wal_replay_resume()")

    def __enter__(self) -> ReplayBursts:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


class BusyHost:
    """``count`` CPU-bound neighbours (each spins for at most ``seconds``), at the host's
    normal priority: lagwatch, the servers and the oracle all compete with them."""

    def __init__(self, count: int | None = None, seconds: float = 60) -> None:
        self.count = count if count is not None else 2 * (os.cpu_count() or 1)
        self.seconds = seconds
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> BusyHost:
        self._procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(self.seconds)]) for _ in range(self.count)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(10)
        self._procs = []
