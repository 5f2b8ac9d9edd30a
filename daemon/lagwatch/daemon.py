"""The scheduler and the cycle: poll -> track -> publish.

apscheduler runs ``Daemon.cycle`` every ``interval`` with ``max_instances=1`` and
``coalesce=True``: a cycle that overruns is logged and counted, never stacked. A failing
node only marks that node down; an unexpected error in a cycle is logged with its trace
and the next cycle runs as usual.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from lagwatch.config import Config, ConfigError, load_config
from lagwatch.durations import format_duration
from lagwatch.holds import HoldStore
from lagwatch.poll import NodePoller, poll_all, pollers_for
from lagwatch.poolcontrol import PoolController
from lagwatch.sdnotify import Notifier
from lagwatch.snapshot import ClusterSnapshot, Snapshot
from lagwatch.tracker import ClusterTracker

log = logging.getLogger("lagwatch.daemon")


class SnapshotHolder:
    """The last published snapshot. Publishing is one reference assignment, so readers in
    other threads (the HTTP server) always see a complete snapshot."""

    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None

    def get(self) -> Snapshot | None:
        return self._snapshot

    def publish(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot


class Daemon:
    def __init__(self, config: Config, config_path: Path | None = None,
                 holder: SnapshotHolder | None = None, notifier: Notifier | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.holder = holder or SnapshotHolder()
        # systemd's notify protocol; a no-op unless given one built from NOTIFY_SOCKET.
        self.notifier = notifier or Notifier({})
        self._trackers: dict[str, ClusterTracker] = {}
        self._pollers: dict[str, list[NodePoller]] = {}
        self._controllers: dict[str, PoolController] = {}
        self._build(config)
        self._cycles = 0
        self._overruns = 0
        self._lock = asyncio.Lock()
        self._stopped = asyncio.Event()
        self._scheduler: AsyncIOScheduler | None = None

    def _build(self, config: Config) -> list[PoolController]:
        """Trackers, pollers and pool controllers for ``config``; on a reload, what can
        carry over does. Returns the controllers no longer needed, for the caller to close."""
        trackers = {}
        for cluster in config.clusters:
            old = self._trackers.get(cluster.name)
            if old is not None and (old.interval, old.window) == (config.interval, config.window):
                old.cluster = cluster  # keep the lag history across a reload
                trackers[cluster.name] = old
            else:
                trackers[cluster.name] = ClusterTracker(cluster, config.interval, config.window)
        self._trackers = trackers
        self._pollers = {c.name: pollers_for(c, config) for c in config.clusters}
        holds = HoldStore(config.holds_file)
        timeout = config.effective_query_timeout
        controllers = {}
        for cluster in config.clusters:
            if cluster.pooler is None:
                continue
            kept = self._controllers.get(cluster.name)
            if kept is not None and kept.reconfigure(cluster, config.interval, holds, timeout):
                controllers[cluster.name] = kept  # streaks, counters and leadership carry over
            else:
                controllers[cluster.name] = PoolController(cluster, config.interval, holds, timeout)
        retired = [c for c in self._controllers.values() if c not in controllers.values()]
        self._controllers = controllers
        return retired

    # -- one cycle ------------------------------------------------------------------------

    async def cycle(self) -> Snapshot:
        async with self._lock:
            started = time.monotonic()
            clusters = self.config.clusters
            budget = self.config.cycle_budget
            results = await asyncio.gather(*(poll_all(self._pollers[c.name], budget) for c in clusters))
            now = time.monotonic()
            tracked = [self._trackers[c.name].update(obs, now) for c, obs in zip(clusters, results, strict=True)]
            snapshots = tuple(await asyncio.gather(*(self._control(cs, now) for cs in tracked)))
            duration = time.monotonic() - started
            self._cycles += 1
            if duration > self.config.interval:
                self._overruns += 1
                log.warning("cycle took %s, longer than the %s interval", format_duration(duration),
                            format_duration(self.config.interval))
            snapshot = Snapshot(taken_at=time.time(), cycle_duration=duration, cycles_total=self._cycles,
                                overruns_total=self._overruns, clusters=snapshots)
            self.holder.publish(snapshot)
            for cluster_snapshot in snapshots:
                log.info("%s", cycle_line(cluster_snapshot))
                for node in cluster_snapshot.nodes:
                    if not node.up:
                        log.debug("%s/%s down: %s", cluster_snapshot.name, node.name, node.last_error)
            self._notify(snapshot)
            return snapshot

    def _notify(self, snapshot: Snapshot) -> None:
        status = "; ".join(cycle_line(c) for c in snapshot.clusters)
        if snapshot.cycles_total == 1:
            self.notifier.ready(status)
        # The watchdog is only fed while polling works: if no node has answered for longer
        # than WatchdogSec, systemd restarts lagwatch (a fresh start may well fix it).
        if any(n.up for c in snapshot.clusters for n in c.nodes):
            self.notifier.watchdog(status)
        else:
            self.notifier.status(f"no node answered the last poll; {status}")

    async def _control(self, cluster: ClusterSnapshot, now: float) -> ClusterSnapshot:
        controller = self._controllers.get(cluster.name)
        if controller is None:
            return cluster
        try:
            return replace(cluster, pool=await controller.step(cluster, now))
        except Exception:  # pool control must never stop the measuring
            log.exception("%s: pool control failed; measuring goes on", cluster.name)
            return cluster

    async def _scheduled_cycle(self) -> None:
        try:
            await self.cycle()
        except Exception:  # never let one bad cycle end the schedule
            log.exception("cycle failed with an unexpected error; the next one runs as usual")

    def _on_skipped(self, event: JobEvent) -> None:
        self._overruns += 1
        log.warning("skipped a cycle: the previous one is still running")

    # -- running --------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig, handler in ((signal.SIGTERM, self.stop), (signal.SIGINT, self.stop),
                             (signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))):
            loop.add_signal_handler(sig, handler)
        # An explicit zone: the interval trigger needs none, and tzlocal would print its guesses.
        scheduler = AsyncIOScheduler(event_loop=loop, timezone=UTC)
        scheduler.add_listener(self._on_skipped, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        self._scheduler = scheduler
        self._add_job()
        scheduler.start()
        log.info("polling %d cluster(s) every %s, window %s", len(self.config.clusters),
                 format_duration(self.config.interval), format_duration(self.config.window))
        self.notifier.ensure_watchdog(watchdog_budget(self.config))
        try:
            await self._stopped.wait()
        finally:
            scheduler.shutdown(wait=False)
            await self.close()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    def _add_job(self) -> None:
        assert self._scheduler is not None
        self._scheduler.add_job(self._scheduled_cycle, "interval", seconds=self.config.interval,
                                id="cycle", replace_existing=True, max_instances=1, coalesce=True,
                                misfire_grace_time=max(1, int(self.config.interval)),
                                next_run_time=datetime.now(UTC))

    def stop(self) -> None:
        log.info("stopping")
        self.notifier.stopping()
        self._stopped.set()

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for pollers in self._pollers.values() for p in pollers),
                             *(c.close() for c in self._controllers.values()))

    async def reload(self) -> bool:
        """Re-read the config file; a bad one is rejected and the running config stays."""
        if self.config_path is None:
            log.warning("reload requested but lagwatch was not started from a config file")
            return False
        self.notifier.reloading()
        try:
            new = load_config(self.config_path)
        except ConfigError as exc:
            log.error("reload rejected, keeping the running config: %s", exc)
            self.notifier.ready("reload rejected, running the previous config")
            return False
        async with self._lock:
            if new.listen != self.config.listen:
                log.warning("listen changed to %s: takes effect on restart", new.listen)
            old_interval = self.config.interval
            await asyncio.gather(*(p.close() for pollers in self._pollers.values() for p in pollers))
            self.config = new
            retired = self._build(new)
            await asyncio.gather(*(c.close() for c in retired))
            if self._scheduler is not None and new.interval != old_interval:
                self._add_job()
        log.info("reloaded %s: %d cluster(s), interval %s", self.config_path, len(new.clusters),
                 format_duration(new.interval))
        self.notifier.ensure_watchdog(watchdog_budget(new))  # the interval may have changed
        self.notifier.ready(f"reloaded {self.config_path}")
        return True


def watchdog_budget(config: Config) -> float:
    """How long systemd must wait for a WATCHDOG=1: a slow cycle may take up to 3 intervals
    plus the query timeout. A WatchdogSec= below that would get lagwatch restarted for every
    slow cycle, so it is raised at runtime (WATCHDOG_USEC=, systemd 236+)."""
    return 3 * config.interval + config.effective_query_timeout


def cycle_line(c: ClusterSnapshot) -> str:
    """The one INFO line per cycle: enough to read the cluster's health at a glance."""
    parts = []
    for r in c.replicas:
        lag = "?" if r.staleness is None else format_duration(r.staleness)
        p95 = "?" if r.window is None else format_duration(r.window.p95)
        flags = "" if r.streaming else " NOT-STREAMING"
        if r.replay_paused:
            flags += " PAUSED"
        if r.node_up is False:
            flags += " DOWN"
        parts.append(f"{r.name}={lag} (p95 {p95}){flags}")
    down = [n.name for n in c.nodes if not n.up]
    tail = f"; down: {', '.join(down)}" if down else ""
    return f"{c.name}: " + (", ".join(parts) or "no replicas") + tail
