"""`lagwatch demo`: a real primary and two streaming replicas on loopback, a steady write
load, replica1's replay paused now and then (seconds of lag) and replica2 applying 30 ms
late (milliseconds of lag), and the daemon watching.

Everything it starts (servers, data directories, the config file) is removed on Ctrl-C,
SIGTERM, or when ``duration`` runs out.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import yaml

from lagwatch.config import load_config
from lagwatch.localcluster import LocalCluster, find_binaries, free_port, port_free

log = logging.getLogger("lagwatch.demo")

# replica1 replays normally for this long, then pauses for PAUSE_SECONDS.
RUN_SECONDS = 20.0
PAUSE_SECONDS = 15.0
# replica2 applies each commit this late (recovery_min_apply_delay): lag a 50 ms SLA sees.
REPLICA2_APPLY_DELAY = 0.03
# Small commits at this steady rate: a busy OLTP primary in miniature.
COMMITS_PER_SECOND = 200


def demo_config(cluster: LocalCluster, listen: str) -> dict[str, object]:
    return {
        "interval": "1s",
        "window": "5m",
        "listen": listen,
        "clusters": [{
            "name": "demo",
            "primary": {"dsn": cluster.primary.dsn()},
            "replicas": [{"name": r.name, "dsn": r.dsn()} for r in cluster.replicas],
        }],
    }


class DemoLoad:
    """Commits small rows at a steady rate and pauses replica1's replay on a cycle."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._writes, name="demo-writes", daemon=True),
                         threading.Thread(target=self._pauses, name="demo-pauses", daemon=True)]

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
                with psycopg.connect(self.cluster.primary.dsn(), autocommit=True) as conn:
                    next_at = time.monotonic()
                    while not self._stop.is_set():
                        conn.execute("INSERT INTO lagwatch_demo (payload) VALUES (md5(random()::text))")
                        # On an absolute schedule, so the rate stays steady whatever a commit took.
                        next_at = max(next_at + period, time.monotonic() - 1.0)
                        self._stop.wait(max(0.0, next_at - time.monotonic()))
            except Exception as exc:  # the demo goes on if the primary hiccups
                log.debug("demo write failed: %s", exc)
                self._stop.wait(1.0)

    def _pauses(self) -> None:
        replica = self.cluster.replicas[0]
        while not self._stop.wait(RUN_SECONDS):
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


def run_demo(listen: str | None = None, pg_major: int | None = None, duration: float | None = None) -> int:
    from lagwatch.runner import run_daemon

    listen = listen or demo_listen()

    # Until the daemon installs its own handlers, SIGTERM must still unwind through the
    # cleanup below rather than kill the process with servers left running.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    binaries = find_binaries(pg_major)
    log.info("demo: starting a PostgreSQL %d primary and two replicas (%s)", binaries.major, binaries.bindir)
    with LocalCluster(binaries, replicas=2) as cluster, tempfile.TemporaryDirectory(prefix="lagwatch-demo-") as tmp:
        cluster.start()
        cluster.replicas[1].set_apply_delay(REPLICA2_APPLY_DELAY)
        config_path = Path(tmp) / "lagwatch.yaml"
        config_path.write_text(yaml.safe_dump(demo_config(cluster, listen), sort_keys=False))
        config = load_config(config_path)
        load = DemoLoad(cluster)
        load.start()
        host, port = config.listen_address
        print(f"""
lagwatch demo is running (PostgreSQL {binaries.major}):
  primary   {cluster.primary.dsn()}
  replicas  {', '.join(f'{r.name}: {r.host}:{r.port}' for r in cluster.replicas)}
  status    http://{host}:{port}/status  (JSON: /api/status)
  metrics   http://{host}:{port}/metrics
  config    {config_path}
  data      {cluster.base_dir}
{COMMITS_PER_SECOND} small commits/s; replica1's replay pauses for {PAUSE_SECONDS:.0f}s every \
{RUN_SECONDS + PAUSE_SECONDS:.0f}s; replica2 applies {REPLICA2_APPLY_DELAY * 1000:.0f} ms late. Ctrl-C stops everything.
""", flush=True)
        if duration is not None:
            _stop_after(duration)
        try:
            return run_daemon(config, config_path)
        finally:
            load.stop()
            log.info("demo: stopping servers and removing their data")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _stop_after(seconds: float) -> None:
    """Send ourselves SIGTERM after ``seconds``: the same clean path as a user's Ctrl-C."""
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.daemon = True
    timer.start()

