"""The scheduler and the cycle: poll -> track -> control -> publish.

apscheduler runs ``Daemon.cycle`` every ``interval`` with ``max_instances=1`` and
``coalesce=True``: a cycle that overruns is logged and counted, never stacked, and while
cycles do not fit the interval lagwatch keeps a longer one (lateness.Pacer) and says so.
A failing node only marks that node down; an unexpected error in a cycle is logged with
its trace and the next cycle runs as usual.

A monitor in trouble never acts: a cluster some of whose answers lagwatch got to too
late (lateness.py) is carried over as the last cycle left it: no node of it reads down,
no pool decision is made, no role changes. A cluster is published once each of its nodes
has answered or failed once (a fresh start reads nodes ``connecting``, not down).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from lagwatch.clusterdir import ClusterDir
from lagwatch.config import ClusterConfig, Config, NodeConfig, load_config
from lagwatch.conninfo import serves_as
from lagwatch.cyclelog import log_cycle, status_line
from lagwatch.discovery import Discovery
from lagwatch.durations import format_duration
from lagwatch.errors import ConfigError
from lagwatch.holds import Holds, HoldsError, HoldStore
from lagwatch.lag import CYCLE_BUCKETS, LagHistogram, nearest_rank
from lagwatch.lateness import Pacer
from lagwatch.leader import Claim, Leadership, lock_key
from lagwatch.poll import NodePoller, poll_all, pollers_for
from lagwatch.poolcontrol import PoolController, Reconfiguration
from lagwatch.sdnotify import Notifier
from lagwatch.session import SessionContext
from lagwatch.snapshot import ClusterSnapshot, NodeObservation, PoolStatus, Snapshot, SnapshotHolder
from lagwatch.tracker import ClusterTracker

log = logging.getLogger("lagwatch.daemon")

CLUSTER_DIR_SCAN_SECONDS = 1.0  # how often clusters_dir is looked at (every cycle, at most once a second)
CYCLE_HISTORY = 600  # cycles whose durations give lagwatch_cycle_duration_window_seconds
CYCLE_QUANTILES = (0.5, 0.9, 0.99, 1.0)
OVERLOAD_SAY_EVERY = 60.0  # seconds between two WARNINGs that cycles do not fit the interval


def _quantiles(durations: deque[float]) -> tuple[tuple[float, float], ...]:
    ordered = sorted(durations)
    return tuple((q, nearest_rank(ordered, q)) for q in CYCLE_QUANTILES) if ordered else ()


# Prepares a reloaded config's part that lives outside the daemon (the web server's TLS
# and auth): may raise to reject the reload; returns what makes it take effect, which must not.
ReloadHook = Callable[[Config], Callable[[], None]]


@dataclass
class _Runtime:
    """Everything a config puts in force. A reload builds a whole new one beside the
    running one, touching nothing that runs; only if all of it builds is it put in force,
    in one step (``Daemon._commit``)."""

    config: Config
    trackers: dict[str, ClusterTracker]
    pollers: dict[str, list[NodePoller]]
    controllers: dict[str, PoolController]
    holds: HoldStore
    claims: dict[str, Claim]  # the leader locks it wants (leader.Leadership.want)
    # Kept controllers and what they take on at commit (their history carries over).
    reconfigured: list[tuple[PoolController, Reconfiguration]] = field(default_factory=list)
    # Kept pollers and the cluster and node config they take on at commit (their connection carries over).
    retargeted: list[tuple[NodePoller, ClusterConfig, NodeConfig]] = field(default_factory=list)
    hooks: list[Callable[[], None]] = field(default_factory=list)


class Daemon:
    def __init__(self, config: Config, config_path: Path | None = None,
                 holder: SnapshotHolder | None = None, notifier: Notifier | None = None,
                 web_config_file: Path | None = None) -> None:
        self.config_path = config_path
        self.web_config_file = web_config_file  # the command line's, kept for reloads
        self.holder = holder or SnapshotHolder()
        # systemd's notify protocol; a no-op unless given one built from NOTIFY_SOCKET.
        self.notifier = notifier or Notifier({})
        self.reload_hooks: list[ReloadHook] = []
        # Every session's connect gate and the loop-lag meter their deadlines count by.
        self.sessions = SessionContext()
        self.leadership = Leadership(self.sessions, config.effective_connect_timeout,
                                     config.effective_query_timeout)
        # The config file as loaded; the source is that plus its clusters_dir's clusters;
        # what runs is the source plus the members discovery found.
        self._file_config = config
        self._dir = ClusterDir(config.clusters_dir) if config.clusters_dir is not None else None
        if self._dir is not None:
            self._dir.scan(_names(config))
        self._dir_scanned_at = time.monotonic()
        self._source = self._with_dir(config, self._dir)
        self.discovery = Discovery()
        # One-shot commands ask once (discover_now) and must not wait on a second ask at exit.
        self.discover_every_cycle = True
        self._runtime = _Runtime(config, {}, {}, {}, HoldStore(config.holds_file), {})
        self._commit(self._build(self._effective(self._source)))
        self._cycles = 0
        self._overruns = 0
        self._durations: deque[float] = deque(maxlen=CYCLE_HISTORY)
        self._duration_histogram = LagHistogram(CYCLE_BUCKETS)
        self._first_cycle: float | None = None
        self._reload_ok = True
        self._reload_success_at = time.time()  # the config loaded at start counts, as in Prometheus
        self._background_errors = 0
        self._lock = asyncio.Lock()
        self._stopped = asyncio.Event()
        self._scheduler: AsyncIOScheduler | None = None
        self._discovering: asyncio.Future[bool] | None = None
        self._members_pending = False  # members that could not be put in force yet
        self._pacer = Pacer(config.interval)
        self._said_overload_at: float | None = None  # when cycles last were said not to fit
        self._overruns_said = 0  # overruns when that was said
        self._published: dict[str, ClusterSnapshot] = {}  # each cluster as the last cycle published it
        self._late_answers = 0
        self._connecting_said = False  # the start's "still connecting" line
        self._cycle_task: asyncio.Task[Any] | None = None  # the cycle under way (a stop waits for it)
        self._started_at = time.monotonic()

    @property
    def config(self) -> Config:
        """The config in force: the file's, discovered clusters as their members make them."""
        return self._runtime.config

    @staticmethod
    def _with_dir(config: Config, cluster_dir: ClusterDir | None) -> Config:
        """The file's clusters and the cluster directory's (their names are unique: the
        directory keeps out a file whose name is taken)."""
        if cluster_dir is None:
            return config
        return config.model_copy(update={"clusters": (*config.clusters, *cluster_dir.clusters)})

    def _effective(self, source: Config) -> Config:
        clusters = (*source.clusters_with_nodes, *self.discovery.cluster_configs(source.patroni_clusters))
        return source.model_copy(update={"clusters": clusters})

    def _build(self, config: Config, *, reloading: bool = True) -> _Runtime:
        """The runtime for ``config``, built beside the one running: what can carry over
        (lag history, connections, pool-control streaks, counters, leadership) is reused,
        but nothing in force is changed here. Raises if any part cannot be built. A rebuild
        for new members (``reloading=False``) leaves the files read on reload alone."""
        running = self._runtime
        trackers = {}
        for cluster in config.clusters_with_nodes:
            old = running.trackers.get(cluster.name)
            if old is not None and (old.interval, old.window, old.horizon) == (config.interval, config.window,
                                                                                config.forecast_horizon):
                trackers[cluster.name] = old  # keeps its history; takes the new cluster config at commit
            else:
                trackers[cluster.name] = ClusterTracker(cluster, config.interval, config.window,
                                                        config.forecast_horizon)
        pollers, retargeted = self._pollers(config)
        holds = running.holds if running.holds.path == config.holds_file else HoldStore(config.holds_file)
        timeout = config.effective_query_timeout
        controllers, reconfigured = {}, []
        for cluster in config.clusters_with_nodes:
            if cluster.pooler is None:
                continue
            kept = running.controllers.get(cluster.name)
            change = kept.prepare(cluster, config.interval, timeout) if kept is not None else None
            if kept is not None and change is not None:
                controllers[cluster.name] = kept  # streaks and counters carry over
                reconfigured.append((kept, change))
            else:
                controllers[cluster.name] = PoolController(cluster, config.interval, timeout)
        hooks = [hook(config) for hook in self.reload_hooks] if reloading else []
        return _Runtime(config, trackers, pollers, controllers, holds, _claims(config), reconfigured, retargeted,
                        hooks)

    def _pollers(self, config: Config) -> tuple[dict[str, list[NodePoller]],
                                                list[tuple[NodePoller, ClusterConfig, NodeConfig]]]:
        """Each node's poller: the running one, with its connection, when the poll
        settings and the node's config are unchanged (or the writer's host list changed
        and still holds the server it is on), else a new one. Discovery rebuilds the
        runtime whenever a cluster's members change: the members that stay keep theirs."""
        running = self._runtime
        no_clusters = {"clusters": ()}
        same_polling = running.config.model_copy(update=no_clusters) == config.model_copy(update=no_clusters)
        pollers: dict[str, list[NodePoller]] = {}
        retargeted = []
        for cluster in config.clusters_with_nodes:
            old = {p.node: p for p in running.pollers.get(cluster.name, ())} if same_polling else {}
            pollers[cluster.name] = []
            for fresh in pollers_for(cluster, config, self.sessions):
                kept = old.get(fresh.node)
                if (kept is not None and kept.role == fresh.role
                        and (kept.cluster.walinspect, kept.cluster.walinspect_max_bytes)
                        == (cluster.walinspect, cluster.walinspect_max_bytes)
                        and serves_as(kept.node_config, fresh.node_config, kept.connected_address())):
                    pollers[cluster.name].append(kept)
                    retargeted.append((kept, cluster, fresh.node_config))
                else:
                    pollers[cluster.name].append(fresh)
        return pollers, retargeted

    def _commit(self, new: _Runtime) -> _Runtime:
        """Put ``new`` in force in one step (nothing here can fail); returns the runtime it
        replaced, whose pollers and retired controllers the caller closes."""
        old, self._runtime = self._runtime, new
        for cluster in new.config.clusters_with_nodes:
            new.trackers[cluster.name].cluster = cluster
        for controller, change in new.reconfigured:
            controller.commit(change)
        for poller, cluster, node_config in new.retargeted:
            poller.cluster, poller.node_config = cluster, node_config
        for apply in new.hooks:
            apply()
        self.leadership.retime(new.config.effective_connect_timeout, new.config.effective_query_timeout)
        return old

    async def _close_replaced(self, old: _Runtime) -> None:
        kept_pollers = {id(p) for pollers in self._runtime.pollers.values() for p in pollers}
        await asyncio.gather(*(p.close() for pollers in old.pollers.values() for p in pollers
                               if id(p) not in kept_pollers))

    # -- one cycle ------------------------------------------------------------------------

    async def cycle(self) -> Snapshot:
        async with self._lock:
            started = time.monotonic()
            runtime = self._runtime
            clusters = runtime.config.clusters_with_nodes
            budget = runtime.config.cycle_budget
            # Members are asked for while the nodes are polled, and never waited for: an
            # answer (or a change) is taken by the first cycle that ends after it, and
            # applies from the next one.
            if self._discovering is None and self._source.patroni_clusters and self.discover_every_cycle:
                self._discovering = asyncio.ensure_future(
                    self.discovery.refresh(self._source.patroni_clusters, budget))
            # Leadership's round trips (one per primary server) run beside the polls.
            await self.leadership.want(runtime.claims)
            rounds = self.leadership.start()
            # Every node of every cluster at once, with one deadline for all.
            pollers = [p for c in clusters for p in runtime.pollers[c.name]]
            answers = iter(await poll_all(pollers, budget, alongside=rounds))
            results = [[next(answers) for _ in runtime.pollers[c.name]] for c in clusters]
            now = time.monotonic()
            self.leadership.settle(now)
            published: list[ClusterSnapshot | None] = []
            fresh: list[ClusterSnapshot] = []
            connecting: list[tuple[str, str]] = []
            for cluster, observations in zip(clusters, results, strict=True):
                tracked = self._track(runtime, cluster, observations, now, connecting)
                published.append(tracked)
                if tracked is not None and not tracked.carried_cycles:
                    fresh.append(tracked)
            pools = await self._control(fresh, now, runtime)
            snapshots = tuple(replace(c, pool=pools[c.name]) if c.name in pools else c
                              for c in published if c is not None)
            self._published = {c.name: c for c in snapshots}
            await self._take_discovery()
            await self._take_cluster_files()
            duration = time.monotonic() - started
            self._cycles += 1
            if self._cycles > 1:  # the first connects to every node: lagwatch_first_cycle_duration_seconds
                self._durations.append(duration)
                self._duration_histogram.observe(duration)
            else:
                self._first_cycle = duration
            loop_lag = self.sessions.loop_lag.take_worst(time.monotonic())
            self._pace(duration, loop_lag)
            self._say_connecting(connecting, sum(len(o) for o in results))
            snapshot = Snapshot(taken_at=time.time(), cycle_duration=duration, cycles_total=self._cycles,
                                overruns_total=self._overruns, clusters=snapshots,
                                reload_successful=self._reload_ok, reload_success_at=self._reload_success_at,
                                background_errors_total=self._background_errors,
                                discovery=self.discovery.statuses(self._source.patroni_clusters),
                                cluster_files=self._cluster_files(),
                                shard=(self.config.shard.index, self.config.shard.count) if self.config.shard else None,
                                cycle_quantiles=_quantiles(self._durations), first_cycle_duration=self._first_cycle,
                                cycle_histogram=self._duration_histogram.snapshot(),
                                interval=self.config.interval, effective_interval=self._pacer.pace.interval,
                                loop_lag=loop_lag,
                                late_answers_total=self._late_answers, connecting=tuple(connecting))
            self.holder.publish(snapshot)
            log_cycle(snapshot)
            self._notify(snapshot)
            return snapshot

    def _track(self, runtime: _Runtime, cluster: ClusterConfig, observations: list[NodeObservation], now: float,
               connecting: list[tuple[str, str]]) -> ClusterSnapshot | None:
        """The cluster as this cycle leaves it: tracked from its answers, or, when some of
        them are no evidence (lagwatch late, a first connection under way), as the last
        cycle published it (None before its first publication)."""
        pending = [o for o in observations if o.pending is not None]
        if not pending:
            return runtime.trackers[cluster.name].update(observations, now)
        self._late_answers += sum(1 for o in pending if o.pending == "late")
        connecting.extend((cluster.name, o.node) for o in pending if o.pending == "connecting")
        last = self._published.get(cluster.name)
        return None if last is None else replace(last, carried_cycles=last.carried_cycles + 1)

    def _pace(self, duration: float, loop_lag: float) -> None:
        """Count an overrun, keep the interval cycles need (rescheduling when it changes),
        and say so: at most one WARNING a minute while cycles do not fit."""
        configured = self.config.interval
        before = self._pacer.pace
        if duration > before.interval:
            self._overruns += 1
        pace = self._pacer.observe(duration, loop_lag)
        if pace.interval != before.interval and self._scheduler is not None:
            self._add_job(pace.interval, first_in=pace.interval)
        now = time.monotonic()
        if pace.overloaded:
            if self._said_overload_at is None or now - self._said_overload_at >= OVERLOAD_SAY_EVERY:
                log.warning("cycles do not fit the %s interval (the last took %s; %d overrun(s) since last said): "
                            "polling every %s until they do; lagwatch_effective_interval_seconds says how far behind",
                            format_duration(configured), format_duration(duration),
                            self._overruns - self._overruns_said, format_duration(pace.interval))
                self._said_overload_at, self._overruns_said = now, self._overruns
        elif before.overloaded:
            log.info("cycles fit the %s interval again (the last took %s)", format_duration(configured),
                     format_duration(duration))
            self._said_overload_at = None

    def _say_connecting(self, connecting: list[tuple[str, str]], nodes: int) -> None:
        """At start, one line for the nodes still connecting and one when none is, not a
        WARNING per node: they are no evidence of anything yet."""
        if self._cycles == 1 and connecting:
            self._connecting_said = True
            log.info("first cycle: %d of %d node(s) answered; %d still connecting (read neither up nor down "
                     "until they answer or fail)", nodes - len(connecting), nodes, len(connecting))
        elif self._connecting_said and not connecting:
            self._connecting_said = False
            log.info("every node has answered or failed once, %s after start",
                     format_duration(time.monotonic() - self._started_at))

    async def discover_now(self, timeout: float = 2.0) -> None:
        """Ask for every discovered cluster's members and put them in force before the
        next cycle (for one-shot commands, which cannot wait for cycles to pass)."""
        async with self._lock:
            if await self.discovery.refresh(self._source.patroni_clusters, timeout):
                await self._members_changed()

    async def _take_discovery(self) -> None:
        task = self._discovering
        if task is None or not task.done():
            return
        self._discovering = None
        try:
            changed = task.result()
        except Exception:  # refresh turns every expected failure into a status
            self._background_errors += 1
            log.exception("member discovery failed unexpectedly; the members in force stay")
            return
        if changed or self._members_pending:
            await self._members_changed()

    async def _take_cluster_files(self) -> None:
        """Cluster files added, changed, broken or removed since the last look (at most one
        look a second): the clusters they make are polled from the next cycle, and every
        other cluster keeps its connections, history and pool state."""
        if self._dir is None or time.monotonic() - self._dir_scanned_at < CLUSTER_DIR_SCAN_SECONDS:
            return
        self._dir_scanned_at = time.monotonic()
        if self._dir.scan(_names(self._file_config)):
            self._source = self._with_dir(self._file_config, self._dir)
            await self._members_changed()
        elif self._members_pending and self._discovering is None:
            await self._members_changed()  # what could not be put in force yet: tried again

    def _cluster_files(self) -> tuple[tuple[str, str | None], ...]:
        return tuple((f.path, f.error) for f in self._dir.files) if self._dir is not None else ()

    async def _members_changed(self) -> None:
        """Put the new memberships in force as a reload would (called holding the lock):
        the changed clusters' new nodes are polled from the next cycle, every node that
        stays keeps its connection, lag history and pool state. If they cannot be put in
        force, the previous ones stay and every later cycle tries again."""
        try:
            runtime = self._build(self._effective(self._source), reloading=False)
        except Exception:  # e.g. a pooler that cannot be built for the new members
            self._background_errors += 1
            if not self._members_pending:
                log.exception("the new members could not be put in force; keeping the previous ones "
                              "and trying again every cycle")
            self._members_pending = True
            return
        if self._members_pending:
            log.info("the new members are in force")
        self._members_pending = False
        await self._close_replaced(self._commit(runtime))

    def _notify(self, snapshot: Snapshot) -> None:
        if not self.notifier.enabled:
            return  # not under systemd: no status line to build
        status = status_line(snapshot)
        if snapshot.cycles_total == 1:
            self.notifier.ready(status)
        # The watchdog is only fed while polling works: if no node has answered for longer
        # than WatchdogSec, systemd restarts lagwatch (a fresh start may well fix it).
        if any(n.up for c in snapshot.clusters for n in c.nodes):
            self.notifier.watchdog(status)
        else:
            self.notifier.status(f"no node answered the last poll; {status}")

    async def _control(self, fresh: list[ClusterSnapshot], now: float,
                       runtime: _Runtime) -> dict[str, PoolStatus | None]:
        """Pool control for the clusters tracked from this cycle's answers: the pooler's
        views that are due read back, every decision, then every apply, each step's I/O
        concurrent across clusters. A cluster whose leadership is not known this cycle
        (its lock session's answer came late) decides nothing, like a carried one. The
        holds file is looked at once. A stopping daemon decides but applies nothing."""
        steps = []
        for cluster in fresh:
            controller = runtime.controllers.get(cluster.name)
            if controller is None:
                continue
            standing = self.leadership.standing(cluster.name)
            if standing.leads is None and not controller.cluster.dry_run:
                continue
            steps.append((cluster, controller, standing))
        if not steps:
            return {cluster.name: runtime.controllers[cluster.name].status() for cluster in fresh
                    if cluster.name in runtime.controllers}
        holds: Holds | HoldsError
        try:
            holds = runtime.holds.current()
        except HoldsError as exc:
            holds = exc
        due = [controller for _, controller, standing in steps if controller.read_due(now, standing)]
        await asyncio.gather(*(controller.read_back(now) for controller in due))
        applies = []
        may_apply = not self._stopped.is_set()
        for cluster, controller, standing in steps:
            try:
                planned = controller.decide(cluster, now, standing, holds, may_apply)
            except Exception:  # pool control must never stop the measuring
                log.exception("%s: pool control failed; measuring goes on", cluster.name)
                continue
            if planned is not None:
                applies.append(controller.apply(*planned))
        await asyncio.gather(*applies)
        return {cluster.name: runtime.controllers[cluster.name].status() for cluster in fresh
                if cluster.name in runtime.controllers}

    async def _scheduled_cycle(self) -> None:
        self._cycle_task = asyncio.current_task()
        try:
            await self.cycle()
        except asyncio.CancelledError:
            if not self._stopped.is_set():
                raise
            # Stopping, and the cycle did not end in time: ended quietly, nothing applied.
        except Exception:  # never let one bad cycle end the schedule
            log.exception("cycle failed with an unexpected error; the next one runs as usual")
        finally:
            self._cycle_task = None

    def _on_skipped(self, event: JobEvent) -> None:
        # A cycle still running when the next was due: counted; said by _pace, at most once a minute.
        self._overruns += 1

    # -- running --------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig, handler in ((signal.SIGTERM, self.stop), (signal.SIGINT, self.stop),
                             (signal.SIGHUP, lambda: self._in_background(self.reload(), "reload"))):
            loop.add_signal_handler(sig, handler)
        # An explicit zone: the interval trigger needs none, and tzlocal would print its guesses.
        scheduler = AsyncIOScheduler(event_loop=loop, timezone=UTC)
        scheduler.add_listener(self._on_skipped, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        self._scheduler = scheduler
        self.sessions.loop_lag.start()
        self._add_job(self._pacer.pace.interval)
        scheduler.start()
        shard = self.config.shard
        log.info("polling %d cluster(s) every %s, window %s%s",
                 len(self._source.clusters_with_nodes) + len(self._source.patroni_clusters),
                 format_duration(self.config.interval), format_duration(self.config.window),
                 f"; shard {shard.index} of 0..{shard.count - 1}: {len(self._source.clusters)} cluster(s) configured"
                 if shard is not None else "")
        if self._dir is not None:
            log.info("clusters_dir %s: %d cluster file(s) in force, %d with errors", self._dir.path,
                     len(self._dir.clusters), sum(1 for f in self._dir.files if f.error is not None))
        self.notifier.ensure_watchdog(watchdog_budget(self.config))
        try:
            await self._stopped.wait()
        finally:
            scheduler.shutdown(wait=False)
            await self._let_the_cycle_end()
            await self.close()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    async def _let_the_cycle_end(self) -> None:
        """A stop in the middle of a cycle lets it end (it applies nothing once stopping:
        the pool stays as it was), for as long as a cycle may wait on its nodes; past that
        it is cancelled, quietly."""
        task = self._cycle_task
        if task is None or task.done():
            return
        done, _ = await asyncio.wait({task}, timeout=self.config.cycle_budget + 1.0)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)

    def _add_job(self, interval: float, first_in: float = 0.0) -> None:
        """The cycle job every ``interval`` seconds, the first ``first_in`` seconds from now."""
        assert self._scheduler is not None
        self._scheduler.add_job(self._scheduled_cycle, "interval", seconds=interval,
                                id="cycle", replace_existing=True, max_instances=1, coalesce=True,
                                misfire_grace_time=max(1, int(interval)),
                                next_run_time=datetime.now(UTC) + timedelta(seconds=first_in))

    def _in_background(self, work: Coroutine[Any, Any, object], what: str) -> None:
        """Run ``work`` as a task whose failure is logged with its trace and counted
        (``lagwatch_background_errors_total``), never dropped."""
        def done(task: asyncio.Task[object]) -> None:
            if not task.cancelled() and task.exception() is not None:
                self._background_errors += 1
                log.error("%s failed", what, exc_info=task.exception())

        asyncio.ensure_future(work).add_done_callback(done)

    def stop(self) -> None:
        log.info("stopping")
        self.notifier.stopping()
        self._stopped.set()

    async def close(self) -> None:
        if self._discovering is not None:
            self._discovering.cancel()  # its worker thread ends by its own deadline
        runtime = self._runtime
        self.sessions.loop_lag.stop()
        await asyncio.gather(*(p.close() for pollers in runtime.pollers.values() for p in pollers),
                             self.leadership.close())

    async def reload(self) -> bool:
        """Re-read the config file (and its web config) and put it in force whole, or not
        at all: a file that does not validate, or a runtime that cannot be built from it,
        leaves everything running as it was, with one log line naming every problem."""
        if self.config_path is None:
            log.warning("reload requested but lagwatch was not started from a config file")
            return False
        self.notifier.reloading()
        try:
            new = load_config(self.config_path, self.web_config_file)
        except ConfigError as exc:
            return self._rejected(str(exc))
        # The cluster directory is rescanned on a copy: a rejected reload must leave the
        # running one's record of what it read as it was.
        cluster_dir = None
        if new.clusters_dir is not None:
            same = self._dir is not None and self._dir.path == new.clusters_dir
            cluster_dir = self._dir.copy() if same and self._dir is not None else ClusterDir(new.clusters_dir)
        if cluster_dir is not None:
            cluster_dir.scan(_names(new))
        source = self._with_dir(new, cluster_dir)
        # Built and put in force under the lock: a membership change committed by a cycle
        # meanwhile is then built upon, never undone by a runtime built before it.
        async with self._lock:
            try:
                runtime = self._build(self._effective(source))
            except ConfigError as exc:
                return self._rejected(str(exc))
            except Exception as exc:  # a rule the schema missed: still nothing changes
                log.exception("building the reloaded config failed")
                return self._rejected(f"{self.config_path}: {type(exc).__name__}: {exc}")
            if new.listen != self.config.listen:
                log.warning("listen changed to %s: takes effect on restart", new.listen)
            old = self._commit(runtime)
            self._file_config, self._dir, self._source = new, cluster_dir, source
            self._dir_scanned_at = time.monotonic()
            if new.interval != old.config.interval:
                self._pacer = Pacer(new.interval)
                if self._scheduler is not None:
                    self._add_job(new.interval)
        await self._close_replaced(old)
        self._reload_ok, self._reload_success_at = True, time.time()
        log.info("reloaded %s: %d cluster(s), interval %s", self.config_path, len(new.clusters),
                 format_duration(new.interval))
        self.notifier.ensure_watchdog(watchdog_budget(new))  # the interval may have changed
        self.notifier.ready(f"reloaded {self.config_path}")
        return True

    def _rejected(self, problems: str) -> bool:
        self._reload_ok = False
        log.error("reload rejected, keeping the running config: %s", problems)
        self.notifier.ready("reload rejected, running the previous config")
        return False


def _names(config: Config) -> set[str]:
    return {c.name for c in config.clusters}


def _claims(config: Config) -> dict[str, Claim]:
    """The clusters whose leader lock this instance wants: those under pool control, but
    not in a dry run (a trial instance must not keep the real one from applying)."""
    return {c.name: Claim(c.primary, lock_key(c.name, c.leader_lock_key))
            for c in config.clusters_with_nodes if c.pooler is not None and not c.dry_run}


def watchdog_budget(config: Config) -> float:
    """How long systemd must wait for a WATCHDOG=1: a slow cycle may take up to 3 intervals
    plus the query timeout. A WatchdogSec= below that would get lagwatch restarted for every
    slow cycle, so it is raised at runtime (WATCHDOG_USEC=, systemd 236+)."""
    return 3 * config.interval + config.effective_query_timeout
