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
from collections.abc import Coroutine
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from lagwatch import runtime as runtime_module
from lagwatch.act.leader import Leadership
from lagwatch.act.poolcontrol import control_all
from lagwatch.config import Config
from lagwatch.durations import format_duration
from lagwatch.errors import ConfigError
from lagwatch.estimate.cyclestats import CycleStats, watchdog_budget
from lagwatch.estimate.evidence import Evidence
from lagwatch.estimate.snapshot import ClusterSnapshot, Snapshot, SnapshotHolder
from lagwatch.read.poll import poll_all
from lagwatch.read.session import SessionContext
from lagwatch.reload import ConfigReload
from lagwatch.runtime import ReloadHook, Runtime
from lagwatch.serve.cyclelog import log_cycle, status_line
from lagwatch.serve.sdnotify import Notifier
from lagwatch.sources.clusters import ClusterSources

log = logging.getLogger("lagwatch.daemon")

class Daemon:
    def __init__(self, config: Config, config_path: Path | None = None,
                 holder: SnapshotHolder | None = None, notifier: Notifier | None = None,
                 web_config_file: Path | None = None) -> None:
        self.holder = holder or SnapshotHolder()
        # systemd's notify protocol; a no-op unless given one built from NOTIFY_SOCKET.
        self.notifier = notifier or Notifier({})
        self.reload_hooks: list[ReloadHook] = []
        # Every session's connect gate and the loop-lag meter their deadlines count by.
        self.sessions = SessionContext()
        self.leadership = Leadership(self.sessions, config.effective_connect_timeout,
                                     config.effective_query_timeout)
        # The config file, its clusters_dir's clusters and the members discovery found
        # (sources.py): what runs is what they make.
        self.sources = ClusterSources(config, time.monotonic())
        self._runtime = Runtime.empty(config)
        self._commit(self._build(self.sources.effective()))
        self._stats = CycleStats(config.interval)
        self.reloads = ConfigReload(config_path, web_config_file, self.notifier)  # SIGHUP's (reload.py)
        self._background_errors = 0
        # Held by a cycle, by a reload while it puts its runtime in force, and by a change of
        # the sources being put in force: one at a time, each built on the last.
        self.lock = asyncio.Lock()
        self._stopped = asyncio.Event()
        self._scheduler: AsyncIOScheduler | None = None
        self._evidence = Evidence()
        self._cycle_task: asyncio.Task[Any] | None = None  # the cycle under way (a stop waits for it)

    @property
    def config(self) -> Config:
        """The config in force: the file's, discovered clusters as their members make them."""
        return self._runtime.config

    @property
    def runtime(self) -> Runtime:
        """What runs now (runtime.py): its pollers, trackers, controllers."""
        return self._runtime

    def _build(self, config: Config, *, reloading: bool = True) -> Runtime:
        """The runtime for ``config``, built beside the one running (runtime.build). A
        rebuild for new members (``reloading=False``) leaves the files read on reload alone."""
        return runtime_module.build(config, self._runtime, self.sessions, self.reload_hooks if reloading else [])

    def _commit(self, new: Runtime) -> Runtime:
        """Put ``new`` in force in one step (nothing here can fail); returns the runtime it
        replaced, whose pollers the caller closes."""
        old, self._runtime = self._runtime, new
        runtime_module.put_in_force(new, self.leadership)
        return old

    async def _close_replaced(self, old: Runtime) -> None:
        await runtime_module.close_replaced(old, self._runtime)

    # -- one cycle ------------------------------------------------------------------------

    async def cycle(self) -> Snapshot:
        async with self.lock:
            started = time.monotonic()
            runtime = self._runtime
            clusters = runtime.config.clusters_with_nodes
            budget = runtime.config.cycle_budget
            # Members are asked for while the nodes are polled, and never waited for: an
            # answer (or a change) is taken by the first cycle that ends after it, and
            # applies from the next one.
            self.sources.ask(budget)
            for writer in runtime.heartbeats.values():
                writer.ensure_started()  # beats on its own schedule, between and beside the cycles
            # Leadership's round trips (one per primary server) run beside the polls.
            await self.leadership.want(runtime.claims)
            rounds = self.leadership.start()
            # Every node of every cluster at once, with one deadline for all.
            pollers = [p for c in clusters for p in runtime.pollers[c.name]]
            answers = iter(await poll_all(pollers, budget, alongside=rounds))
            results = [[next(answers) for _ in runtime.pollers[c.name]] for c in clusters]
            now = time.monotonic()
            self.leadership.settle(now)
            connecting: list[tuple[str, str]] = []
            published = [self._evidence.track(runtime.trackers[cluster.name], observations, now, connecting)
                         for cluster, observations in zip(clusters, results, strict=True)]
            snapshots = await self._control(runtime, [c for c in published if c is not None], now)
            if self.sources.take_changes(time.monotonic()):
                await self.put_sources_in_force()
            duration = time.monotonic() - started
            loop_lag = self.sessions.loop_lag.take_worst(time.monotonic())
            stats = self._stats
            new_pace = stats.finished(duration, loop_lag)
            if new_pace is not None and self._scheduler is not None:
                self._add_job(new_pace.interval, first_in=new_pace.interval)
            self._evidence.say_connecting(stats.cycles, connecting, sum(len(o) for o in results))
            snapshot = self._snapshot(snapshots, duration, loop_lag, connecting)
            self.holder.publish(snapshot)
            log_cycle(snapshot)
            self.notifier.cycle(snapshot.cycles_total == 1, status_line(snapshot) if self.notifier.enabled else "",
                                any(n.up for c in snapshot.clusters for n in c.nodes))
            return snapshot

    async def _control(self, runtime: Runtime, published: list[ClusterSnapshot],
                       now: float) -> tuple[ClusterSnapshot, ...]:
        """Pool control for the clusters tracked afresh (a carried one keeps its pool as it
        was); the clusters with their pools, and remembered as this cycle published them."""
        fresh = [c for c in published if not c.carried_cycles]
        pools = await control_all(fresh, runtime.controllers, self.leadership.standing, runtime.holds, now,
                                  may_apply=not self._stopped.is_set())
        snapshots = tuple(replace(c, pool=pools[c.name]) if c.name in pools else c for c in published)
        self._evidence.published(snapshots)
        return snapshots

    def _snapshot(self, clusters: tuple[ClusterSnapshot, ...], duration: float, loop_lag: float,
                  connecting: list[tuple[str, str]]) -> Snapshot:
        stats, shard = self._stats, self.config.shard
        return Snapshot(taken_at=time.time(), cycle_duration=duration, cycles_total=stats.cycles,
                        overruns_total=stats.overruns, clusters=clusters, reload_successful=self.reloads.ok,
                        reload_success_at=self.reloads.success_at,
                        background_errors_total=self._background_errors + self.sources.errors,
                        discovery=self.sources.statuses(), cluster_files=self.sources.cluster_files(),
                        shard=(shard.index, shard.count) if shard is not None else None,
                        cycle_quantiles=stats.quantiles(), first_cycle_duration=stats.first_cycle,
                        cycle_histogram=stats.histogram(), interval=self.config.interval,
                        effective_interval=stats.pace.interval, loop_lag=loop_lag,
                        late_answers_total=self._evidence.late_answers, connecting=tuple(connecting))

    async def discover_now(self, timeout: float = 2.0) -> None:
        """Ask for every discovered cluster's members and put them in force before the
        next cycle (for one-shot commands, which cannot wait for cycles to pass)."""
        async with self.lock:
            if await self.sources.ask_now(timeout):
                await self.put_sources_in_force()

    async def take_changes(self, now: float) -> None:
        """What a cycle does at its end: the sources' changes since the last look (as of
        ``now``) put in force, for the next cycle."""
        async with self.lock:
            if self.sources.take_changes(now):
                await self.put_sources_in_force()

    async def put_sources_in_force(self) -> None:
        """Put what the sources make now in force as a reload would (called holding the
        lock): the changed clusters' new nodes are polled from the next cycle, every node
        that stays keeps its connection, lag history and pool state. If it cannot be put in
        force, the previous one stays and every later cycle tries again."""
        try:
            runtime = self._build(self.sources.effective(), reloading=False)
        except Exception as exc:  # e.g. a pooler that cannot be built for the new members
            self._background_errors += 1
            self.sources.failed(exc)
            return
        self.sources.in_force()
        await self._close_replaced(self._commit(runtime))

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
        # A cycle still running when the next was due: counted; said at most once a minute.
        self._stats.skipped()

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
        self._add_job(self._stats.pace.interval)
        scheduler.start()
        shard = self.config.shard
        log.info("polling %d cluster(s) every %s, window %s%s",
                 len(self.sources.source.clusters_with_nodes) + len(self.sources.source.patroni_clusters),
                 format_duration(self.config.interval), format_duration(self.config.window),
                 f"; shard {shard.index} of 0..{shard.count - 1}: {len(self.sources.source.clusters)} cluster(s) "
                 "configured"
                 if shard is not None else "")
        described = self.sources.describe()
        if described is not None:
            log.info("%s", described)
        self.notifier.ensure_watchdog(watchdog_budget(self.config.interval, self.config.effective_query_timeout))
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
        self.sources.close()
        runtime = self._runtime
        self.sessions.loop_lag.stop()
        await asyncio.gather(*(p.close() for pollers in runtime.pollers.values() for p in pollers),
                             *(w.close() for w in runtime.heartbeats.values()), self.leadership.close())

    async def reload(self) -> bool:
        """Re-read the config file and put it in force whole, or not at all (reload.py)."""
        return await self.reloads(self.put_in_force)

    async def put_in_force(self, new: Config) -> None:
        """Put a reloaded config in force: its sources read beside the running ones, a runtime
        built from them and swapped in; raises ConfigError and changes nothing if the runtime
        cannot be built (reload.py: the reload is rejected). Closing what it replaced comes
        after: its failure is not a rejection."""
        reloaded = self.sources.reloaded(new)  # a rejected reload leaves the running ones as they were
        # Built and put in force under the lock: a membership change committed by a cycle
        # meanwhile is then built upon, never undone by a runtime built before it.
        async with self.lock:
            try:
                runtime = self._build(self.sources.effective(reloaded.source))
            except ConfigError:
                raise
            except Exception as exc:  # a rule the schema missed: still nothing changes
                log.exception("building the reloaded config failed")
                raise ConfigError("the reloaded config", [f"{type(exc).__name__}: {exc}"]) from exc
            if new.listen != self.config.listen:
                log.warning("listen changed to %s: takes effect on restart", new.listen)
            old = self._commit(runtime)
            self.sources.adopt(reloaded, time.monotonic())
            if new.interval != old.config.interval:
                self._stats.new_interval(new.interval)
                if self._scheduler is not None:
                    self._add_job(new.interval)
        await self._close_replaced(old)
