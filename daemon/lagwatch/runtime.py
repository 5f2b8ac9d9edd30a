"""What a config puts in force, and how a new one is built beside the running one.

A reload (or new members from discovery, or a changed cluster file) builds a whole new
``Runtime`` beside the one running, reusing what can carry over (lag history, connections,
pool-control streaks and counters) but changing nothing in force; only if all of it builds
is it put in force, in one step (``put_in_force``), which cannot fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from lagwatch.act.holds import HoldStore
from lagwatch.act.leader import Claim, Leadership, lock_key
from lagwatch.act.poolcontrol import PoolController, Reconfiguration
from lagwatch.config import ClusterConfig, Config, NodeConfig
from lagwatch.estimate.tracker import ClusterTracker
from lagwatch.read.conninfo import serves_as
from lagwatch.read.heartbeat import HeartbeatWriter
from lagwatch.read.poll import NodePoller, pollers_for
from lagwatch.read.session import SessionContext

# Prepares a reloaded config's part that lives outside the daemon (the web server's TLS
# and auth): may raise to reject the reload; returns what makes it take effect, which must not.
ReloadHook = Callable[[Config], Callable[[], None]]


@dataclass
class Runtime:
    """Everything a config puts in force."""

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
    heartbeats: dict[str, HeartbeatWriter] = field(default_factory=dict)  # the clusters that configure one

    @classmethod
    def empty(cls, config: Config) -> Runtime:
        return cls(config, {}, {}, {}, HoldStore(config.holds_file), {})


def build(config: Config, running: Runtime, sessions: SessionContext, hooks: list[ReloadHook]) -> Runtime:
    """The runtime for ``config``, built beside ``running``: what can carry over is reused,
    but nothing in force is changed here. Raises if any part cannot be built. ``hooks``:
    the reload hooks to prepare (none for a rebuild for new members, which leaves the files
    read on reload alone)."""
    trackers = {}
    for cluster in config.clusters_with_nodes:
        old = running.trackers.get(cluster.name)
        if old is not None and (old.interval, old.window, old.horizon) == (config.interval, config.window,
                                                                            config.forecast_horizon):
            trackers[cluster.name] = old  # keeps its history; takes the new cluster config at commit
        else:
            trackers[cluster.name] = ClusterTracker(cluster, config.interval, config.window, config.forecast_horizon)
    pollers, retargeted = _pollers(config, running, sessions)
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
    prepared = [hook(config) for hook in hooks]
    heartbeats = {}
    for cluster in config.clusters_with_nodes:
        if cluster.heartbeat is not None:
            writer = running.heartbeats.get(cluster.name)
            heartbeats[cluster.name] = writer if writer is not None and writer.serves(cluster) \
                else HeartbeatWriter(cluster, config)
    return Runtime(config, trackers, pollers, controllers, holds, claims(config), reconfigured, retargeted, prepared,
                   heartbeats)


def _pollers(config: Config, running: Runtime, sessions: SessionContext) -> tuple[
        dict[str, list[NodePoller]], list[tuple[NodePoller, ClusterConfig, NodeConfig]]]:
    """Each node's poller: the running one, with its connection, when the poll settings and
    the node's config are unchanged (or the writer's host list changed and still holds the
    server it is on), else a new one. Discovery rebuilds the runtime whenever a cluster's
    members change: the members that stay keep theirs."""
    no_clusters = {"clusters": ()}
    same_polling = running.config.model_copy(update=no_clusters) == config.model_copy(update=no_clusters)
    pollers: dict[str, list[NodePoller]] = {}
    retargeted = []
    for cluster in config.clusters_with_nodes:
        old = {p.node: p for p in running.pollers.get(cluster.name, ())} if same_polling else {}
        pollers[cluster.name] = []
        for fresh in pollers_for(cluster, config, sessions):
            kept = old.get(fresh.node)
            if (kept is not None and kept.role == fresh.role
                    and _set_when_made(kept.cluster) == _set_when_made(cluster)
                    and serves_as(kept.node_config, fresh.node_config, kept.connected_address())):
                pollers[cluster.name].append(kept)
                retargeted.append((kept, cluster, fresh.node_config))
            else:
                pollers[cluster.name].append(fresh)
    return pollers, retargeted


def put_in_force(new: Runtime, leadership: Leadership) -> None:
    """What ``new`` changes in the objects it kept, in one step (nothing here can fail)."""
    for cluster in new.config.clusters_with_nodes:
        tracker = new.trackers[cluster.name]
        tracker.cluster = cluster
        writer = new.heartbeats.get(cluster.name)
        tracker.beats = writer.beats if writer is not None else None
    for controller, change in new.reconfigured:
        controller.commit(change)
    for poller, cluster, node_config in new.retargeted:
        poller.cluster, poller.node_config = cluster, node_config
    for apply in new.hooks:
        apply()
    leadership.retime(new.config.effective_connect_timeout, new.config.effective_query_timeout)


async def close_replaced(old: Runtime, current: Runtime) -> None:
    """Close what ``old`` had and ``current`` did not keep."""
    kept = {id(p) for pollers in current.pollers.values() for p in pollers}
    kept_writers = {id(w) for w in current.heartbeats.values()}
    await asyncio.gather(*(p.close() for pollers in old.pollers.values() for p in pollers if id(p) not in kept),
                         *(w.close() for w in old.heartbeats.values() if id(w) not in kept_writers))


def claims(config: Config) -> dict[str, Claim]:
    """The clusters whose leader lock this instance wants: those under pool control, but
    not in a dry run (a trial instance must not keep the real one from applying)."""
    return {c.name: Claim(c.primary, lock_key(c.name, c.leader_lock_key))
            for c in config.clusters_with_nodes if c.pooler is not None and not c.dry_run}


def _set_when_made(cluster: ClusterConfig) -> tuple[object, ...]:
    """What a poller reads that is set when it is made: a primary's WAL reads, a replica's
    heartbeat row (a heartbeat turned on, off or moved by a reload makes new pollers), the
    schemas its session searches."""
    return (cluster.walinspect, cluster.walinspect_max_bytes, cluster.lag_from_wal, cluster.lag_from_wal_max_bytes,
            cluster.heartbeat, cluster.schemas)
