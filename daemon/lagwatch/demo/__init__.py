"""`lagwatch demo`: a real primary and two streaming replicas on loopback, a steady write
load, replica1's replay paused now and then (seconds of lag) and replica2 applying 30 ms
late (milliseconds of lag), and the daemon watching, with pool control over a read pool:
a real PgBouncer when Debian's is installed (``lagwatch.demo.pool``), else a ``command``
pooler that writes the pool's backends to a file, so a newcomer watches replica1 leave the
pool while it lags and rejoin when it has caught up (on /status, in the log, and in
PgBouncer or the file).

Everything it starts (servers, data directories, the config file) is removed on Ctrl-C,
SIGTERM, or when ``duration`` runs out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from lagwatch.config import load_config
from lagwatch.demo.binaries import find_binaries
from lagwatch.demo.cluster import LocalCluster
from lagwatch.demo.pool import DATABASE, DemoPgBouncer
from lagwatch.demo.ports import free_port, port_free

log = logging.getLogger("lagwatch.demo")

# replica1 replays normally for this long, then pauses for PAUSE_SECONDS (the first pause
# comes sooner: a newcomer should not wait to see the pool change).
RUN_SECONDS = 20.0
FIRST_PAUSE_AFTER = 8.0
PAUSE_SECONDS = 15.0
# replica2 applies each commit this late (recovery_min_apply_delay): lag a 50 ms SLA sees.
REPLICA2_APPLY_DELAY = 0.03
# Small commits at this steady rate: a busy OLTP primary in miniature.
COMMITS_PER_SECOND = 200


def writer_dsn(cluster: LocalCluster) -> str:
    """Every server, the writable one wins: what survives a switchover (libpq's own
    multi-host failover), for the load and for lagwatch's primary alike."""
    servers = [cluster.primary, *cluster.replicas]
    return (f"host={','.join(s.host for s in servers)} port={','.join(str(s.port) for s in servers)} "
            "user=postgres dbname=postgres target_session_attrs=read-write")


def demo_config(cluster: LocalCluster, listen: str, workdir: Path,
                pgbouncer: DemoPgBouncer | None = None) -> dict[str, object]:
    if pgbouncer is not None:
        pooler: dict[str, object] = {
            "kind": "pgbouncer", "admin_dsn": pgbouncer.admin_dsn, "include_file": str(pgbouncer.include_file),
            "database": DATABASE, "options": pgbouncer.options,
            "when_empty": "keep"}  # min_replicas keeps one in; the writer DSN is no one address
    else:
        # The read pool as a file: what a pooler's include file would hold.
        pooler = {"kind": "command", "template": "# lagwatch demo read pool\n{backends}\n",
                  "output_file": str(workdir / "read-pool.txt"), "reload_command": ["true"]}
    return {
        "interval": "1s",
        "window": "5m",
        "listen": listen,
        "state_dir": str(workdir / "state"),
        "clusters": [{
            "name": "demo",
            "primary": {"dsn": writer_dsn(cluster)},
            "replicas": [{"name": r.name, "dsn": r.dsn()} for r in cluster.replicas],
            # replica1's pauses break this; replica2's 30 ms never does.
            "sla": {"max_lag": "2s", "eject_after": 2, "readmit_below": "500ms", "readmit_after": 3,
                    "min_replicas": 1},
            "pooler": pooler,
        }],
    }


class DemoLoad:
    """Commits small rows at a steady rate and pauses replica1's replay on a cycle."""

    def __init__(self, cluster: LocalCluster, switchover_after: float | None = None) -> None:
        self.cluster = cluster
        self.switchover_after = switchover_after
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._writes, name="demo-writes", daemon=True),
                         threading.Thread(target=self._pauses, name="demo-pauses", daemon=True)]
        if switchover_after is not None:
            self._threads.append(threading.Thread(target=self._switchover, name="demo-switchover", daemon=True))

    def start(self) -> None:
        self.cluster.primary.execute("CREATE TABLE IF NOT EXISTS lagwatch_demo (id bigserial PRIMARY KEY, "
                                     "at timestamptz DEFAULT now(), payload text)")
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def _writes(self) -> None:
        import psycopg

        period = 1.0 / COMMITS_PER_SECOND
        while not self._stop.is_set():
            try:
                with psycopg.connect(writer_dsn(self.cluster), autocommit=True, connect_timeout=2) as conn:
                    next_at = time.monotonic()
                    while not self._stop.is_set():
                        conn.execute("INSERT INTO lagwatch_demo (payload) VALUES (md5(random()::text))")
                        # On an absolute schedule, so the rate stays steady whatever a commit took.
                        next_at = max(next_at + period, time.monotonic() - 1.0)
                        self._stop.wait(max(0.0, next_at - time.monotonic()))
            except Exception as exc:  # the demo goes on if the primary hiccups
                log.debug("demo write failed: %s", exc)
                self._stop.wait(1.0)

    def _switchover(self) -> None:
        """What an operator without a failover tool does: stop the primary, promote the
        replica that is not lagging, point the other one at it (with the slot it uses)."""
        assert self.switchover_after is not None
        if self._stop.wait(self.switchover_after):
            return
        old, (lagging, chosen) = self.cluster.primary, self.cluster.replicas
        try:
            log.warning("demo: switchover: stopping the primary, promoting %s", chosen.name)
            old.stop()
            chosen.execute("SELECT pg_promote(true, 30)")
            chosen.execute("SELECT pg_create_physical_replication_slot(%s)", (lagging.slot_name,))
            lagging.alter_system("primary_conninfo", f"host={chosen.host} port={chosen.port} user=postgres "
                                                     f"application_name={lagging.application_name}")
            lagging.reload()
            log.warning("demo: switchover done: %s is the primary, %s follows it, the old primary is stopped",
                        chosen.name, lagging.name)
        except Exception as exc:  # the demo goes on; the log says what did not happen
            log.error("demo: switchover failed: %s", exc)

    def _pauses(self) -> None:
        replica = self.cluster.replicas[0]
        wait = FIRST_PAUSE_AFTER
        while not self._stop.wait(wait):
            wait = RUN_SECONDS
            log.info("demo: pausing %s's replay for %.0fs (watch its lag grow)", replica.name, PAUSE_SECONDS)
            replica.pause_replay()
            stopped = self._stop.wait(PAUSE_SECONDS)
            replica.resume_replay()
            log.info("demo: resumed %s's replay", replica.name)
            if stopped:
                return


DEFAULT_LISTEN = ("127.0.0.1", 9847)


def demo_listen() -> str:
    """lagwatch's usual port if it is free here, else any free loopback port."""
    host, port = DEFAULT_LISTEN
    if not port_free(host, port):
        port = free_port([host])
    return f"{host}:{port}"


def run_demo(listen: str | None = None, pg_major: int | None = None, duration: float | None = None,
             switchover_after: float | None = None) -> int:
    from lagwatch.runner import run_daemon

    listen = listen or demo_listen()

    # Until the daemon installs its own handlers, SIGTERM must still unwind through the
    # cleanup below rather than kill the process with servers left running.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    binaries = find_binaries(pg_major)
    log.info("demo: starting a PostgreSQL %d primary and two replicas (%s)", binaries.major, binaries.bindir)
    with (LocalCluster(binaries, replicas=2) as cluster, tempfile.TemporaryDirectory(prefix="lagwatch-demo-") as tmp,
          contextlib.ExitStack() as stack,  # exits first: PgBouncer stops before the servers
          _deaf_while_cleaning_up()):
        cluster.start()
        cluster.replicas[1].set_apply_delay(REPLICA2_APPLY_DELAY)
        pgbouncer = stack.enter_context(DemoPgBouncer(cluster)) if DemoPgBouncer.available() else None
        config_path = Path(tmp) / "lagwatch.yaml"
        config_path.write_text(yaml.safe_dump(demo_config(cluster, listen, Path(tmp), pgbouncer), sort_keys=False))
        config = load_config(config_path)
        load = DemoLoad(cluster, switchover_after)
        load.start()
        host, port = config.listen_address
        print(f"""
lagwatch demo is running (PostgreSQL {binaries.major}):
  primary   {cluster.primary.dsn()}
  replicas  {', '.join(f'{r.name}: {r.host}:{r.port}' for r in cluster.replicas)}
  status    http://{host}:{port}/status  (JSON: /api/status)
  metrics   http://{host}:{port}/metrics
  config    {config_path}
  read pool {_read_pool_line(Path(tmp), pgbouncer)}
  data      {cluster.base_dir}
{COMMITS_PER_SECOND} small commits/s; replica1's replay pauses for {PAUSE_SECONDS:.0f}s after \
{FIRST_PAUSE_AFTER:.0f}s, then every {RUN_SECONDS + PAUSE_SECONDS:.0f}s; replica2 applies \
{REPLICA2_APPLY_DELAY * 1000:.0f} ms late.{_switchover_line(switchover_after)} Ctrl-C stops everything.
""", flush=True)
        if duration is not None:
            _stop_after(duration)
        try:
            return run_daemon(config, config_path)
        finally:
            _ignore_stop_signals()
            load.stop()
            log.info("demo: stopping servers and removing their data")


def _read_pool_line(workdir: Path, pgbouncer: DemoPgBouncer | None) -> str:
    if pgbouncer is None:
        return f"{workdir / 'read-pool.txt'}  (a file; replica1 leaves it while over its 2s SLA)"
    return (f"{pgbouncer.include_file}  (PgBouncer's {DATABASE}: psql \"{pgbouncer.dsn()}\"; "
            "replica1 leaves it while over its 2s SLA)")


def _switchover_line(after: float | None) -> str:
    if after is None:
        return ""
    return (f"\nAfter {after:.0f}s: switchover (the primary stops, replica2 is promoted, replica1 follows it);"
            " lagwatch's primary DSN finds the new primary.")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _ignore_stop_signals() -> None:
    """From here the demo only cleans up (pg_ctl stops with timeouts, then the data is
    removed): a second Ctrl-C or SIGTERM (an impatient user, ``timeout`` signalling its
    process group too) must not end it half way, servers running or data left behind."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def _deaf_while_cleaning_up() -> Iterator[None]:
    """Stop signals ignored once the demo's ``with`` unwinds, whatever made it (the daemon's
    end, or a signal or error while the servers were starting)."""
    try:
        yield
    finally:
        _ignore_stop_signals()


def _stop_after(seconds: float) -> None:
    """Send ourselves SIGTERM after ``seconds``: the same clean path as a user's Ctrl-C."""
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.daemon = True
    timer.start()

