"""Prometheus exposition of the last published snapshot: a custom collector, no I/O.

A scrape renders whatever the last cycle published; a replica or slot that is gone from
the snapshot is gone from the output (its family stays declared: every family in
lagwatch.render.families is, on every scrape). No timestamps are set. The families are built as
lagwatch.render.exposition's, which write their text as they are built: /metrics joins it
(``families`` then ``exposition.render_text``), and ``SnapshotCollector`` hands the same
text, read back, to a prometheus_client registry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from lagwatch.estimate.diagnosis import CAUSES
from lagwatch.estimate.diagnosis import STAGES as DIAGNOSIS_STAGES
from lagwatch.estimate.snapshot import OBSERVED_ROLES, ClusterSnapshot, Snapshot
from lagwatch.render import families as f
from lagwatch.render.exposition import Family, collecting, quantile_label, to_prometheus
from lagwatch.rooms import ROOMS
from lagwatch.views.replication import STAGES

if TYPE_CHECKING:
    from prometheus_client.core import Metric

ERROR_KINDS = ("connect", "timeout", "query")
SYNC_STATES = ("async", "potential", "sync", "quorum")


def families(snapshot: Snapshot | None, also: Callable[[], object] | None = None) -> list[Family]:
    """Every family lagwatch exports, in the catalogue's order, with ``snapshot``'s samples:
    the daemon's own, then the clusters', each cluster's samples in the one family of each
    name (exposition.collecting); ``also`` adds samples of its own meanwhile (the HTTP
    server's). Before the first poll, only what ``also`` adds."""
    with collecting() as made:
        if also is not None:
            also()
        if snapshot is None:
            return list(made.values())
        _daemon_metrics(snapshot)
        for cluster in snapshot.clusters:
            _cluster_metrics(cluster)
        return [made.get(name) or spec.make() for name, spec in f.CATALOGUE.items()]


class SnapshotCollector:
    """The last snapshot's families for a prometheus_client registry, which takes any
    object with ``collect``: not deriving from its ``Collector`` keeps prometheus_client's
    modules (~1 MB resident) out of the daemon, which writes /metrics itself."""

    def __init__(self, current: Callable[[], Snapshot | None]) -> None:
        self._current = current

    def describe(self) -> list[Metric]:
        # Tell the registry nothing up front so that registering never calls collect().
        return []

    def collect(self) -> Iterator[Metric]:
        yield from to_prometheus(families(self._current()))


def _daemon_metrics(snapshot: Snapshot) -> None:
    f.CYCLE_DURATION.add([], snapshot.cycle_duration)
    if snapshot.cycle_quantiles and snapshot.cycle_histogram is not None:
        h = snapshot.cycle_histogram
        f.CYCLE_WINDOW.make().add_metric([], ((quantile_label(q), s) for q, s in snapshot.cycle_quantiles),
                                         h.count, h.total)
    if snapshot.cycle_histogram is not None:
        h = snapshot.cycle_histogram
        f.CYCLES_HISTOGRAM.make().add_metric([], list(zip(_les(h.bounds), h.cumulative, strict=True)),
                                             sum_value=h.total, native=h.native)
    if snapshot.first_cycle_duration is not None:
        f.FIRST_CYCLE.add([], snapshot.first_cycle_duration)
    f.CYCLES.add([], snapshot.cycles_total)
    f.OVERRUNS.add([], snapshot.overruns_total)
    f.LAST_POLL.add([], snapshot.taken_at)
    f.INTERVAL.add([], snapshot.interval)
    f.EFFECTIVE_INTERVAL.add([], snapshot.effective_interval)
    f.LOOP_LAG.add([], snapshot.loop_lag)
    f.LATE_ANSWERS.add([], snapshot.late_answers_total)
    f.CONNECTING.add([], len(snapshot.connecting))
    f.RELOAD_OK.add([], 1.0 if snapshot.reload_successful else 0.0)
    f.RELOAD_AT.add([], snapshot.reload_success_at)
    f.BACKGROUND_ERRORS.add([], snapshot.background_errors_total)
    for d in snapshot.discovery:
        member = f.PATRONI_MEMBER.make()
        for name, role, state in d.patroni_members:
            member.add_metric([d.cluster, name, role, state])
        f.DISCOVERY_UP.add([d.cluster], 1.0 if d.up else 0.0)
        f.DISCOVERY_MEMBERS.add([d.cluster], d.members)
        f.DISCOVERY_ERRORS.add([d.cluster], d.errors_total)
        if d.last_success_at is not None:
            f.DISCOVERY_SUCCESS.add([d.cluster], d.last_success_at)
    if snapshot.shard is not None:
        f.SHARD.add([str(snapshot.shard[0]), str(snapshot.shard[1])], 1.0)
    for path, error in snapshot.cluster_files:
        f.CLUSTER_FILE_ERRORS.add([path], 0.0 if error is None else 1.0)


def _cluster_metrics(c: ClusterSnapshot) -> None:
    _node_metrics(c)
    _role_metrics(c)
    _replica_metrics(c)
    _diagnosis_metrics(c)
    _forecast_and_sla_metrics(c)
    _logical_metrics(c)
    _wal_metrics(c)
    _pool_metrics(c)
    _sync_metrics(c)
    for room in ROOMS:
        if room.name in c.rooms:
            room.export(c.name, c.rooms[room.name])


def _node_metrics(c: ClusterSnapshot) -> None:
    up, duration, polls, connects = f.UP.make(), f.POLL_DURATION.make(), f.POLLS.make(), f.CONNECTS.make()
    errors, view_up, view_errors, info = f.POLL_ERRORS.make(), f.VIEW_UP.make(), f.VIEW_ERRORS.make(), \
        f.NODE_INFO.make()
    for n in c.nodes:
        key = [c.name, n.name]
        up.add_metric(key, 1.0 if n.up else 0.0)
        duration.add_metric(key, n.poll_duration)
        polls.add_metric(key, n.polls_total)
        connects.add_metric(key, n.connects_total)
        errors.add_metrics(key, ((kind, n.errors_total.get(kind, 0)) for kind in ERROR_KINDS))
        info.add_metric([c.name, n.name, n.observed_role, str(n.version_num or "")])
        view_up.add_metrics(key, ((view, 1.0 if ok else 0.0) for view, ok in sorted(n.views.items())))
        for view, count in sorted(n.view_errors_total.items()):
            view_errors.add_metric([c.name, n.name, view], count)


def _role_metrics(c: ClusterSnapshot) -> None:
    role, timeline = f.NODE_ROLE.make(), f.NODE_TIMELINE.make()
    for n in c.nodes:
        role.add_metrics([c.name, n.name],
                         ((name, 1.0 if n.observed_role == name else 0.0) for name in OBSERVED_ROLES))
        if n.timeline is not None:
            timeline.add_metric([c.name, n.name], n.timeline)
    f.PRIMARIES.add([c.name], c.primaries)
    f.ROLE_CHANGES.add([c.name], c.role_changes_total)


def _replica_metrics(c: ClusterSnapshot) -> None:
    if not c.replicas:
        return
    states = [f.CONFIGURED.make(), f.FOLLOWS.make(), f.STREAMING.make(), f.LAG.make(), f.PAUSED.make(),
              f.RECEIVE_REPLAY.make(), f.REPLAY_TIMESTAMP_AGE.make()]
    window, samples, hist = f.LAG_WINDOW.make(), f.LAG_WINDOW_SAMPLES.make(), f.LAG_HISTOGRAM.make()
    lag_bytes, ws_lag, info = f.LAG_BYTES.make(), f.WALSENDER_LAG.make(), f.REPLICA_INFO.make()
    for r in c.replicas:
        key = [c.name, r.name]
        # Each absent while unknown (streaming: while this role may not see it).
        values = (float(r.configured), _flag(r.follows_primary), _flag(r.streaming), r.staleness,
                  _flag(r.replay_paused), r.receive_replay_bytes, r.last_replay_age_seconds)
        for family, value in zip(states, values, strict=True):
            if value is not None:
                family.add_metric(key, value)
        h = r.histogram
        if r.window is not None:
            window.add_metric(key, ((quantile_label(q), v) for q, v in r.window.quantiles), h.count, h.total)
            samples.add_metric(key, r.window.count)
        hist.add_metric(key, list(zip(_les(h.bounds), h.cumulative, strict=True)), sum_value=h.total,
                        native=h.native)
        ws = r.walsender
        if ws is not None:
            lag_bytes.add_metrics(key, _present((stage, ws.lag_bytes(stage)) for stage in STAGES))
            ws_lag.add_metrics(key, _present((stage, ws.lag_seconds(stage)) for stage in STAGES[1:]))
        info.add_metric(key + [ws.state or "" if ws else "", ws.sync_state or "" if ws else "",
                               r.wal_receiver_status or "", r.staleness_source or "", r.staleness_evidence or ""])


def _diagnosis_metrics(c: ClusterSnapshot) -> None:
    """Why each replica lags (diagnosis.py), how busy its replay is, its conflicts."""
    for r in c.replicas:
        key = [c.name, r.name]
        d = r.diagnosis
        if d is not None:
            f.LAG_CAUSE.make().add_metrics(key, ((cause, float(cause == d.cause)) for cause in CAUSES))
            f.LAG_STAGE.make().add_metrics(key, zip(DIAGNOSIS_STAGES, d.stage_seconds, strict=True))
            f.LAG_STAGE_BYTES.make().add_metrics(key, _present(zip(DIAGNOSIS_STAGES, d.stage_bytes, strict=True)))
        load = r.replay_load
        if load is not None and load.busy_ratio is not None:
            f.REPLAY_BUSY.add(key, load.busy_ratio)
        if load is not None and load.startup_reads is not None:
            f.STARTUP_READS.add(key, load.startup_reads)
        rec = r.recovery
        if rec is None:
            continue
        f.CONFLICTS.make().add_metrics(key, sorted(r.conflicts_total.items()))
        f.CONFLICT_HOLDERS.add(key, len(rec.holders))
        if rec.holders:  # oldest first (views/recovery.py)
            h = rec.holders[0]
            f.CONFLICT_HOLDER.add(key + [str(h.pid), h.user or "", rec.conflict or ""], h.xact_age or 0.0)


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


def _present(pairs: Iterator[tuple[str, float | None]]) -> Iterator[tuple[str, float]]:
    return ((label, value) for label, value in pairs if value is not None)


def _forecast_and_sla_metrics(c: ClusterSnapshot) -> None:
    for r in c.replicas:
        if r.catch_up is None:
            continue
        key = [c.name, r.name]
        f.BACKLOG.add(key, r.catch_up.backlog_bytes)
        if r.catch_up.replay_rate is not None:
            f.REPLAY_RATE.add(key, r.catch_up.replay_rate)
        if r.catch_up.eta_seconds is not None:
            f.ETA.add(key, r.catch_up.eta_seconds)
    for name, sla in sorted(c.slas.items()):
        f.SLA_MAX_LAG.add([c.name, name], sla.max_lag)
        if sla.p95 is not None:
            f.SLA_P95.add([c.name, name], sla.p95)
    f.MIN_REPLICAS.add([c.name], c.min_replicas)



def _logical_metrics(c: ClusterSnapshot) -> None:
    """The logical consumers (logical.py): their own families, apart from the replicas'."""
    for lc in c.logical:
        key = [c.name, lc.consumer, lc.slot]
        f.LOGICAL_ACTIVE.add(key, float(lc.active))
        if lc.staleness is not None:
            f.LOGICAL_STALENESS.add(key, lc.staleness)
        if lc.window is not None:
            quantiles = ((quantile_label(q), v) for q, v in lc.window.quantiles)
            f.LOGICAL_WINDOW.make().add_metrics(key, quantiles)
        if lc.lag_bytes is not None:
            f.LOGICAL_BYTES.add(key, lc.lag_bytes)
        f.LOGICAL_INFO.make().add_metric(key + [lc.state or "", lc.database or "", lc.plugin or "", lc.evidence or ""])


def _wal_metrics(c: ClusterSnapshot) -> None:
    key = [c.name]
    if c.primary_lsn is not None:
        f.PRIMARY_LSN.add(key, c.primary_lsn)
    if c.wal_rate_bytes_per_second is not None:
        f.WAL_RATE.add(key, c.wal_rate_bytes_per_second)
    if c.wal_dating is not None:
        f.WAL_DATING_READ.add(key, c.wal_dating.read_bytes)
        f.WAL_DATING_READS.add(key, c.wal_dating.reads)
        f.WAL_DATING_CANCELLED.add(key, c.wal_dating.cancelled)
        f.WAL_DATING_FAILED.add(key, c.wal_dating.failed)
        f.WAL_DATING_RETRIED.add(key, c.wal_dating.retried)
    if c.heartbeat is not None:
        f.HEARTBEAT_BEATS.add(key, c.heartbeat[0])
        f.HEARTBEAT_ERRORS.add(key, c.heartbeat[1])
    wi = c.walinspect
    if wi is not None:
        f.WAL_INSPECTED.add(key, wi.inspected_bytes)
        f.WAL_INSPECTED_FPI.add(key, wi.fpi_bytes)
        f.WAL_INSPECT_SKIPPED.add(key, wi.skipped_bytes)
        if wi.last_interval_bytes:
            f.WAL_FPI_SHARE.add(key, wi.last_interval_fpi_bytes / wi.last_interval_bytes)
        for method, (count, stored_bytes, raw_bytes) in sorted(wi.compressed.items()):
            f.WAL_FPI_SAVED.add([c.name, method], max(0, raw_bytes - stored_bytes))
            f.WAL_FPI_STORED.add([c.name, method], stored_bytes)
            f.WAL_FPI_IMAGES.add([c.name, method], count)


def _pool_metrics(c: ClusterSnapshot) -> None:
    pool = c.pool
    if pool is None:
        return
    key = [c.name]
    f.LEADER.add(key, 1.0 if pool.leader else 0.0)
    if pool.leader_holder is not None:
        h = pool.leader_holder
        f.LEADER_HOLDER.add([c.name, str(h.pid), h.application_name, h.user, "true" if h.is_lagwatch else "false"],
             1.0)
    f.DRY_RUN.add(key, 1.0 if pool.dry_run else 0.0)
    f.APPLY_ERRORS.add(key, pool.apply_errors_total)
    f.READ_ERRORS.add(key, pool.read_errors_total)
    # Every member ever changed stays (a removed fallback primary reads 0, not absent).
    names = sorted({*pool.reasons, *(pool.members or ()), *(pool.pooler_members or ()),
                    *(member for member, _ in pool.changes_total)})
    for name in names:
        if pool.members is not None:
            f.POOL_MEMBER.add([c.name, name], 1.0 if name in pool.members else 0.0)
        if pool.pooler_members is not None:
            f.POOLER_MEMBER.add([c.name, name], 1.0 if name in pool.pooler_members else 0.0)
    for (name, action), count in sorted(pool.changes_total.items()):
        f.POOL_CHANGES.add([c.name, name, action], count)
    for name, hold in sorted(pool.holds.items()):
        f.POOL_HELD.add([c.name, name, hold], 1.0)


def _sync_metrics(c: ClusterSnapshot) -> None:
    """Whether commits can complete: absent while the primary does not answer."""
    s = c.sync
    if s is None:
        return
    key = [c.name]
    f.SYNC_REQUIRED.add(key, s.required)
    f.SYNC_HEALTHY.add(key, s.healthy)
    f.SYNC_WAITS.add(key, 1.0 if s.waits_on_standbys else 0.0)
    f.SYNC_AT_RISK.add(key, 1.0 if s.at_risk else 0.0)
    if s.commit_wait_seconds is not None:
        f.SYNC_WAIT.add(key, s.commit_wait_seconds)
    state = f.SYNC_STATE.make()
    for r in c.replicas:
        if r.walsender is not None:
            current = r.walsender.sync_state or "async"
            state.add_metrics([c.name, r.name],
                              ((name, 1.0 if current == name else 0.0) for name in SYNC_STATES))
    f.SYNC_INFO.make().add_metric([c.name, s.standby_names, s.synchronous_commit,
                                   s.method or "", s.error or ""])


@functools.lru_cache(maxsize=8)
def _les(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """The le label of each bucket bound (the bounds are the same for every replica)."""
    return tuple("+Inf" if bound == float("inf") else repr(bound) for bound in bounds)


if __name__ == "__main__":
    import sys

    sys.stdout.write(f.markdown())  # docs/metrics.md: this module's families and the rooms'
