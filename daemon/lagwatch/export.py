"""Prometheus exposition of the last published snapshot: a custom collector, no I/O.

A scrape renders whatever the last cycle published; a replica or slot that is gone from
the snapshot is gone from the output. No timestamps are set. The families are built as
lagwatch.exposition's, which write their text as they are built: /metrics joins it
(``families`` then ``exposition.render_text``), and ``SnapshotCollector`` hands the same
text, read back, to a prometheus_client registry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from lagwatch.exposition import Counter as CounterMetricFamily
from lagwatch.exposition import Family, collecting, to_prometheus
from lagwatch.exposition import Gauge as GaugeMetricFamily
from lagwatch.exposition import Histogram as HistogramMetricFamily
from lagwatch.exposition import Info as InfoMetricFamily
from lagwatch.snapshot import OBSERVED_ROLES, ClusterSnapshot, Snapshot
from lagwatch.views.replication import STAGES

if TYPE_CHECKING:
    from prometheus_client.core import Metric

AS_OF = " (as of last poll)"
ERROR_KINDS = ("connect", "timeout", "query")
WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")


def _gauge(name: str, doc: str, labels: list[str], unit_doc: str = "") -> GaugeMetricFamily:
    """A gauge family; every gauge says that it is as of the last poll."""
    return GaugeMetricFamily(name, doc + unit_doc + AS_OF, labels=labels)


def families(snapshot: Snapshot | None) -> list[Family]:
    """Every family of ``snapshot``: the daemon's own, then the clusters', each cluster's
    samples in the one family of each name (exposition.collecting)."""
    if snapshot is None:
        return []
    with collecting() as made:
        for _ in _daemon_metrics(snapshot):
            pass
        for cluster in snapshot.clusters:
            for _ in _cluster_metrics(cluster):
                pass
    return list(made.values())


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


def _daemon_metrics(snapshot: Snapshot) -> Iterator[Family]:
    yield GaugeMetricFamily("lagwatch_cycle_duration_seconds", "Duration of the last poll cycle" + AS_OF,
                            value=snapshot.cycle_duration)
    window = _gauge("lagwatch_cycle_duration_window_seconds", "Quantiles of the last 600 cycles' durations "
                    "(nearest rank; quantile=1 is the max; the first cycle, which connects, left out)", ["quantile"])
    for q, seconds in snapshot.cycle_quantiles:
        window.add_metric([_fmt_q(q)], seconds)
    yield window
    if snapshot.cycle_histogram is not None:
        h = snapshot.cycle_histogram
        hist = HistogramMetricFamily("lagwatch_cycle_seconds", "Histogram of every cycle's duration since start "
                                     "(the first cycle, which connects, left out)")
        hist.add_metric([], list(zip(_les(h.bounds), h.cumulative, strict=True)), sum_value=h.total)
        yield hist
    if snapshot.first_cycle_duration is not None:
        yield GaugeMetricFamily("lagwatch_first_cycle_duration_seconds", "Duration of the first cycle after start, "
                                "which connects to every node", value=snapshot.first_cycle_duration)
    yield CounterMetricFamily("lagwatch_cycles", "Poll cycles completed", value=snapshot.cycles_total)
    yield CounterMetricFamily("lagwatch_cycle_overruns", "Cycles that took longer than the interval, "
                              "or were skipped because the previous one was still running",
                              value=snapshot.overruns_total)
    yield GaugeMetricFamily("lagwatch_last_poll_timestamp_seconds",
                            "Unix time the last cycle was published", value=snapshot.taken_at)
    yield GaugeMetricFamily("lagwatch_interval_seconds", "The configured poll interval", value=snapshot.interval)
    yield GaugeMetricFamily("lagwatch_effective_interval_seconds", "The interval lagwatch keeps now: longer than "
                            "the configured one while its cycles do not fit that (LagwatchOverloaded)",
                            value=snapshot.effective_interval)
    yield GaugeMetricFamily("lagwatch_loop_lag_seconds", "The worst lateness of lagwatch's own event loop since "
                            "the previous cycle: how late it was to get to what it waited for (a busy host, "
                            "a fleet too big for the interval)", value=snapshot.loop_lag)
    yield CounterMetricFamily("lagwatch_late_answers", "Node answers lagwatch got to too late to count for or "
                              "against their node: their cluster kept its previous state that cycle (no node "
                              "read down, no pool decision)", value=snapshot.late_answers_total)
    yield GaugeMetricFamily("lagwatch_nodes_connecting", "Nodes still making their first connection: they read "
                            "neither up nor down, and their cluster is published once each of its nodes has "
                            "answered or failed", value=len(snapshot.connecting))
    # The names Prometheus and Alertmanager use for the same thing.
    yield GaugeMetricFamily("lagwatch_config_last_reload_successful",
                            "1 if the last config reload was put in force, 0 if it was rejected "
                            "(the running config stays)", value=1.0 if snapshot.reload_successful else 0.0)
    yield GaugeMetricFamily("lagwatch_config_last_reload_success_timestamp_seconds",
                            "Unix time the config in force was loaded", value=snapshot.reload_success_at)
    yield CounterMetricFamily("lagwatch_background_errors", "Background tasks that failed (each logged "
                              "with its trace)", value=snapshot.background_errors_total)
    yield from _discovery_metrics(snapshot)
    if snapshot.shard is not None:
        shard = _gauge("lagwatch_shard", "1: this instance watches the clusters rendezvous hashing gives shard index "
                       "of count", ["index", "count"])
        shard.add_metric([str(snapshot.shard[0]), str(snapshot.shard[1])], 1.0)
        yield shard
    if snapshot.cluster_files:
        errors = _gauge("lagwatch_cluster_config_errors", "1 if the clusters_dir file does not validate as it is "
                        "(a new one is not watched; a changed one keeps its last good version), else 0", ["file"])
        for path, error in snapshot.cluster_files:
            errors.add_metric([path], 0.0 if error is None else 1.0)
        yield errors


def _discovery_metrics(snapshot: Snapshot) -> Iterator[Family]:
    if not snapshot.discovery:
        return
    up = _gauge("lagwatch_discovery_up", "1 if the cluster's members were discovered in the last cycle; 0 if "
                "Patroni did not answer usefully (the last known members stay in force)", ["cluster"])
    members = _gauge("lagwatch_discovery_members", "Members in force for the cluster (the last known ones while "
                     "discovery is down)", ["cluster"])
    errors = CounterMetricFamily("lagwatch_discovery_errors", "Failed attempts to discover the cluster's members",
                                 labels=["cluster"])
    success = _gauge("lagwatch_discovery_last_success_timestamp_seconds", "Unix time the cluster's members were "
                     "last discovered", ["cluster"])
    member = InfoMetricFamily("lagwatch_patroni_member", "Each discovered member's role and state as Patroni "
                              "said last (role: leader, replica, sync_standby, quorum_standby, standby_leader)",
                              labels=["cluster", "member", "role", "state"])
    for d in snapshot.discovery:
        for name, role, state in d.patroni_members:
            member.add_metric([d.cluster, name, role, state], {})
        up.add_metric([d.cluster], 1.0 if d.up else 0.0)
        members.add_metric([d.cluster], d.members)
        errors.add_metric([d.cluster], d.errors_total)
        if d.last_success_at is not None:
            success.add_metric([d.cluster], d.last_success_at)
    yield from (up, members, errors, success, member)


def _cluster_metrics(c: ClusterSnapshot) -> Iterator[Family]:
    yield from _node_metrics(c)
    yield from _role_metrics(c)
    yield from _replica_metrics(c)
    yield from _slot_metrics(c)
    yield from _wal_metrics(c)
    yield from _pool_metrics(c)
    yield from _sync_metrics(c)


SYNC_STATES = ("async", "potential", "sync", "quorum")


def _sync_metrics(c: ClusterSnapshot) -> Iterator[Family]:
    """Whether commits can complete: absent while the primary does not answer."""
    s = c.sync
    if s is None:
        return
    labels = ["cluster"]
    yield _one_sample(_gauge("lagwatch_sync_standbys_required", "Standbys each commit waits for, from "
                             "synchronous_standby_names (FIRST n / ANY n; 0: none)", labels), [c.name], s.required)
    yield _one_sample(_gauge("lagwatch_sync_standbys_healthy", "Standbys named in synchronous_standby_names that "
                             "are connected and streaming", labels), [c.name], s.healthy)
    yield _one_sample(_gauge("lagwatch_sync_commit_waits_on_standbys", "1 if commits wait on standbys: standbys "
                             "required and synchronous_commit is remote_write, on or remote_apply", labels),
                      [c.name], 1.0 if s.waits_on_standbys else 0.0)
    yield _one_sample(_gauge("lagwatch_sync_commit_at_risk", "1 if fewer standbys are healthy than commits wait "
                             "for: commits on the primary stall until one returns", labels),
                      [c.name], 1.0 if s.at_risk else 0.0)
    wait = _gauge("lagwatch_sync_commit_wait_seconds", "What a commit waits for now: the write, flush or replay lag "
                  "(as synchronous_commit says) of the standbys it waits for (absent when none or unknown)", labels)
    if s.commit_wait_seconds is not None:
        wait.add_metric([c.name], s.commit_wait_seconds)
    yield wait
    state = _gauge("lagwatch_replica_sync_state", "1 for the replica's sync_state in pg_stat_replication "
                   "(async, potential, sync, quorum), 0 for the others", ["cluster", "replica", "state"])
    for r in c.replicas:
        if r.walsender is not None:
            current = r.walsender.sync_state or "async"
            state.add_metrics([c.name, r.name], ((name, 1.0 if current == name else 0.0) for name in SYNC_STATES))
    yield state
    info = InfoMetricFamily("lagwatch_sync", "synchronous_standby_names and synchronous_commit on the primary"
                            + AS_OF, labels=["cluster", "standby_names", "synchronous_commit", "method", "error"])
    info.add_metric([c.name, s.standby_names, s.synchronous_commit, s.method or "", s.error or ""], {})
    yield info


def _role_metrics(c: ClusterSnapshot) -> Iterator[Family]:
    role = _gauge("lagwatch_node_role", "1 for the node's role as observed in the last poll (primary: accepts "
                  "writes; unknown: no answer), 0 for the others", ["cluster", "node", "role"])
    timeline = _gauge("lagwatch_node_timeline", "The timeline a primary writes on, or a replica's WAL receiver "
                      "last received on", ["cluster", "node"])
    for n in c.nodes:
        role.add_metrics([c.name, n.name], ((name, 1.0 if n.observed_role == name else 0.0) for name in OBSERVED_ROLES))
        if n.timeline is not None:
            timeline.add_metric([c.name, n.name], n.timeline)
    primaries = _gauge("lagwatch_cluster_primaries", "Distinct servers of the cluster that accept writes "
                       "(2 or more: split brain; one server reached under two names counts once)", ["cluster"])
    primaries.add_metric([c.name], c.primaries)
    changes = CounterMetricFamily("lagwatch_cluster_role_changes", "Nodes seen to change role (replica to "
                                  "primary or back) since lagwatch started", labels=["cluster"])
    changes.add_metric([c.name], c.role_changes_total)
    yield from (role, timeline, primaries, changes)


def _node_metrics(c: ClusterSnapshot) -> Iterator[Family]:
    up = _gauge("lagwatch_up", "1 if the node answered the last poll, else 0", ["cluster", "node"])
    duration = _gauge("lagwatch_poll_duration_seconds", "Time spent polling the node", ["cluster", "node"])
    polls = CounterMetricFamily("lagwatch_polls", "Polls attempted per node", labels=["cluster", "node"])
    connects = CounterMetricFamily("lagwatch_connects", "Connection attempts per node (one persistent session "
                                   "each: this grows only on reconnects)", labels=["cluster", "node"])
    errors = CounterMetricFamily("lagwatch_poll_errors", "Failed polls per node by kind "
                                 "(connect, timeout, query)", labels=["cluster", "node", "kind"])
    view_up = _gauge("lagwatch_view_up", "1 if the view was read from the node in the last poll; 0 if it failed, "
                     "rests after a failure, or the role may not read it", ["cluster", "node", "view"])
    view_errors = CounterMetricFamily("lagwatch_view_errors", "Failed reads of a view, per node",
                                      labels=["cluster", "node", "view"])
    info = InfoMetricFamily("lagwatch_node", "Observed role and server version of each node" + AS_OF,
                            labels=["cluster", "node", "role", "server_version_num"])
    for n in c.nodes:
        up.add_metric([c.name, n.name], 1.0 if n.up else 0.0)
        duration.add_metric([c.name, n.name], n.poll_duration)
        polls.add_metric([c.name, n.name], n.polls_total)
        connects.add_metric([c.name, n.name], n.connects_total)
        errors.add_metrics([c.name, n.name], ((kind, n.errors_total.get(kind, 0)) for kind in ERROR_KINDS))
        info.add_metric([c.name, n.name, n.observed_role, str(n.version_num or "")], {})
        view_up.add_metrics([c.name, n.name], ((view, 1.0 if ok else 0.0) for view, ok in sorted(n.views.items())))
        for view, count in sorted(n.view_errors_total.items()):
            view_errors.add_metric([c.name, n.name, view], count)
    yield from (up, duration, polls, connects, errors, view_up, view_errors, info)


def _replica_metrics(c: ClusterSnapshot) -> Iterator[Family]:
    labels = ["cluster", "replica"]
    lag = _gauge("lagwatch_replica_lag_seconds", "Staleness: age of the oldest change the replica has not "
             "replayed, measured on lagwatch's monotonic clock; 0 when fully replayed", labels)
    window = _gauge("lagwatch_replica_lag_window_seconds", "Quantiles of staleness over the window "
                "(nearest rank; quantile=1 is the max)", labels + ["quantile"])
    samples = _gauge("lagwatch_replica_lag_window_samples", "Staleness samples in the window", labels)
    hist = HistogramMetricFamily("lagwatch_replica_lag_sampled_seconds",
                                 "Histogram of every per-cycle staleness sample since start", labels=labels)
    lag_bytes = _gauge("lagwatch_replica_lag_bytes", "Primary's current WAL LSN minus the replica's "
                   "sent/write/flush/replay LSN from pg_stat_replication", labels + ["stage"])
    ws_lag = _gauge("lagwatch_replica_walsender_lag_seconds", "write_lag/flush_lag/replay_lag from "
                "pg_stat_replication; NULL while caught up is reported as 0", labels + ["stage"])
    paused = _gauge("lagwatch_replica_replay_paused", "1 if WAL replay is paused or a pause was requested", labels)
    streaming = _gauge("lagwatch_replica_streaming", "1 if the replica's WAL receiver is streaming", labels)
    rr_bytes = _gauge("lagwatch_replica_receive_replay_bytes", "Received but not yet replayed WAL, "
                  "on the replica", labels)
    ts_age = _gauge("lagwatch_replica_last_replay_timestamp_age_seconds", "now() - pg_last_xact_replay_timestamp() "
                "on the replica. NOT lag: it grows on an idle primary", labels)
    follows = _gauge("lagwatch_replica_follows_primary", "1 if the replica replicates from the current primary "
                     "(the primary streams to it, or it receives on the primary's timeline), else 0", labels)
    configured = _gauge("lagwatch_replica_configured", "1 if the replica is in lagwatch's config, 0 if only "
                    "seen in pg_stat_replication", labels)
    info = InfoMetricFamily("lagwatch_replica", "State of the replica" + AS_OF,
                            labels=labels + ["state", "sync_state", "wal_receiver_status", "lag_source",
                                          "lag_evidence"])
    for r in c.replicas:
        key = [c.name, r.name]
        configured.add_metric(key, 1.0 if r.configured else 0.0)
        if r.follows_primary is not None:
            follows.add_metric(key, 1.0 if r.follows_primary else 0.0)
        if r.streaming is not None:  # absent while this role may not see it
            streaming.add_metric(key, 1.0 if r.streaming else 0.0)
        if r.staleness is not None:
            lag.add_metric(key, r.staleness)
        if r.window is not None:
            window.add_metrics(key, ((_fmt_q(q), value) for q, value in r.window.quantiles))
            samples.add_metric(key, r.window.count)
        h = r.histogram
        hist.add_metric(key, list(zip(_les(h.bounds), h.cumulative, strict=True)), sum_value=h.total)
        if r.walsender is not None:
            sender = r.walsender
            lag_bytes.add_metrics(key, ((stage, b) for stage in STAGES if (b := sender.lag_bytes(stage)) is not None))
            ws_lag.add_metrics(key, ((stage, t) for stage in STAGES[1:]
                                     if (t := sender.lag_seconds(stage)) is not None))
        if r.replay_paused is not None:
            paused.add_metric(key, 1.0 if r.replay_paused else 0.0)
        if r.receive_replay_bytes is not None:
            rr_bytes.add_metric(key, r.receive_replay_bytes)
        if r.last_replay_age_seconds is not None:
            ts_age.add_metric(key, r.last_replay_age_seconds)
        ws = r.walsender
        info.add_metric(key + [ws.state or "" if ws else "", ws.sync_state or "" if ws else "",
                               r.wal_receiver_status or "", r.staleness_source or "",
                               r.staleness_evidence or ""], {})
    yield from (lag, window, samples, hist, lag_bytes, ws_lag, paused, streaming, rr_bytes, ts_age,
                configured, follows, info)
    replay_rate = _gauge("lagwatch_replica_replay_rate_bytes_per_second", "How fast the replica replays WAL: "
                         "since replay last stood still, within forecast_horizon", labels)
    backlog = _gauge("lagwatch_replica_catchup_backlog_bytes", "WAL the primary wrote that the replica has not "
                     "replayed", labels)
    eta = _gauge("lagwatch_replica_catchup_eta_seconds", "When the replica will have replayed everything: the "
                 "backlog over (replay rate - WAL generation rate); 0 when caught up, +Inf when not catching up",
                 labels)
    for r in c.replicas:
        if r.catch_up is None:
            continue
        key = [c.name, r.name]
        backlog.add_metric(key, r.catch_up.backlog_bytes)
        if r.catch_up.replay_rate is not None:
            replay_rate.add_metric(key, r.catch_up.replay_rate)
        if r.catch_up.eta_seconds is not None:
            eta.add_metric(key, r.catch_up.eta_seconds)
    yield from (replay_rate, backlog, eta)
    sla_lag = _gauge("lagwatch_replica_sla_max_lag_seconds", "The replica's SLA max_lag from the config", labels)
    sla_p95 = _gauge("lagwatch_replica_sla_p95_seconds", "The replica's SLA p95 from the config (absent if unset)",
                     labels)
    for name, sla in sorted(c.slas.items()):
        sla_lag.add_metric([c.name, name], sla.max_lag)
        if sla.p95 is not None:
            sla_p95.add_metric([c.name, name], sla.p95)
    yield sla_lag
    yield sla_p95
    yield _one_sample(_gauge("lagwatch_pool_min_replicas", "The cluster's SLA min_replicas from the config",
                             ["cluster"]), [c.name], c.min_replicas)


def _slot_metrics(c: ClusterSnapshot) -> Iterator[Family]:
    labels = ["cluster", "slot"]
    retained = _gauge("lagwatch_slot_retained_bytes", "WAL the slot holds back: pg_current_wal_lsn() - restart_lsn",
                      labels)
    active = _gauge("lagwatch_slot_active", "1 if a consumer is connected to the slot", labels)
    safe = _gauge("lagwatch_slot_safe_wal_size_bytes", "WAL that can still be written before the slot is "
              "in danger of losing its WAL (absent when max_slot_wal_keep_size is unlimited)", labels)
    status = _gauge("lagwatch_slot_wal_status", "1 for the slot's current wal_status", labels + ["status"])
    inactive = _gauge("lagwatch_slot_inactive_seconds", "Time since the slot became inactive (PostgreSQL 17+)", labels)
    logical = _gauge("lagwatch_slot_confirmed_flush_lag_bytes", "Logical slot: current LSN minus "
                 "confirmed_flush_lsn", labels)
    info = InfoMetricFamily("lagwatch_slot", "Slot type and state" + AS_OF,
                            labels=labels + ["slot_type", "database", "plugin", "temporary",
                                          "conflicting", "invalidation_reason"])
    for s in c.slots:
        key = [c.name, s.name]
        active.add_metric(key, 1.0 if s.active else 0.0)
        if s.retained_bytes is not None:
            retained.add_metric(key, s.retained_bytes)
        if s.safe_wal_size is not None:
            safe.add_metric(key, s.safe_wal_size)
        if s.wal_status is not None:
            status.add_metrics(key, ((value, 1.0 if s.wal_status == value else 0.0) for value in WAL_STATUSES))
        if s.inactive_seconds is not None:
            inactive.add_metric(key, s.inactive_seconds)
        if s.confirmed_flush_lag_bytes is not None:
            logical.add_metric(key, s.confirmed_flush_lag_bytes)
        info.add_metric(key + [s.slot_type, s.database or "", s.plugin or "", str(s.temporary).lower(),
                               "" if s.conflicting is None else str(s.conflicting).lower(),
                               s.invalidation_reason or ""], {})
    yield from (retained, active, safe, status, inactive, logical, info)
    runway = _gauge("lagwatch_slot_runway_seconds", "Seconds until safe_wal_size reaches 0 at the current net rate "
                    "(WAL written minus WAL the consumer releases, over forecast_horizon); +Inf when it does not "
                    "shrink; absent when max_slot_wal_keep_size is unlimited", labels)
    for name, seconds in sorted(c.slot_runways.items()):
        runway.add_metric([c.name, name], seconds)
    share = _gauge("lagwatch_slot_wal_dir_share", "WAL a slot with no max_slot_wal_keep_size limit retains, as a "
                   "share of the pg_wal directory (needs pg_ls_waldir())", labels)
    if c.wal_dir is not None and c.wal_dir.bytes > 0:
        for s in c.slots:
            if s.safe_wal_size is None and s.retained_bytes is not None:
                share.add_metric([c.name, s.name], min(1.0, s.retained_bytes / c.wal_dir.bytes))
    yield from (runway, share)


def _wal_metrics(c: ClusterSnapshot) -> Iterator[Family]:
    labels = ["cluster"]
    key = [c.name]
    if c.primary_lsn is not None:
        yield _one_sample(_gauge("lagwatch_primary_wal_lsn_bytes", "Primary's current WAL LSN as a byte position",
                                 labels), key, c.primary_lsn)
    if c.wal_rate_bytes_per_second is not None:
        yield _one_sample(_gauge("lagwatch_wal_rate_bytes_per_second",
                                 "WAL generation rate over forecast_horizon (a minute by default)", labels),
                          key, c.wal_rate_bytes_per_second)
    if c.wal_dir is not None:
        yield _one_sample(_gauge("lagwatch_wal_directory_bytes", "Size of the primary's pg_wal directory", labels),
                    key, c.wal_dir.bytes)
        yield _one_sample(_gauge("lagwatch_wal_directory_files", "Files in the primary's pg_wal directory", labels),
                    key, c.wal_dir.files)
    w = c.wal
    if w is not None:
        info = GaugeMetricFamily("lagwatch_wal_compression_info", "1 for the wal_compression method in use "
                                 "(off, pglz, lz4, zstd)" + AS_OF, labels=["cluster", "method"])
        info.add_metric([c.name, w.compression], 1.0)
        yield info
        if w.max_slot_wal_keep_bytes is not None:
            yield _one_sample(_gauge("lagwatch_max_slot_wal_keep_size_bytes", "max_slot_wal_keep_size setting", labels),
                        key, w.max_slot_wal_keep_bytes)
        counters = (("lagwatch_wal_bytes", "WAL bytes generated (pg_stat_wal.wal_bytes)", w.bytes),
                    ("lagwatch_wal_records", "WAL records generated (pg_stat_wal.wal_records)", w.records),
                    ("lagwatch_wal_fpi", "Full-page images generated (pg_stat_wal.wal_fpi)", w.fpi),
                    ("lagwatch_wal_buffers_full", "Times WAL buffers were full (pg_stat_wal)", w.buffers_full),
                    ("lagwatch_wal_writes", "WAL writes (pg_stat_wal, before PostgreSQL 18)", w.writes),
                    ("lagwatch_wal_syncs", "WAL syncs (pg_stat_wal, before PostgreSQL 18)", w.syncs))
        for name, doc, value in counters:
            if value is not None:
                yield _counter(name, doc, labels, key, value)
    wi = c.walinspect
    if wi is not None:
        for name, doc, value in (
            ("lagwatch_wal_inspected_bytes", "WAL bytes read by pg_walinspect", wi.inspected_bytes),
            ("lagwatch_wal_inspected_fpi_bytes", "Full-page image bytes in the inspected WAL "
             "(after compression)", wi.fpi_bytes),
            ("lagwatch_wal_inspect_skipped_bytes", "WAL bytes not inspected because a cycle's cap was "
             "reached", wi.skipped_bytes),
        ):
            yield _counter(name, doc, labels, key, value)
        if wi.last_interval_bytes:
            yield _one_sample(_gauge("lagwatch_wal_fpi_share", "Share of full-page image bytes in the WAL inspected "
                           "last (every 10 s; 0-1)", labels), key, wi.last_interval_fpi_bytes / wi.last_interval_bytes)
        if wi.compressed:
            saved = CounterMetricFamily("lagwatch_wal_fpi_saved_bytes", "Bytes WAL compression saved on full-page "
                                        "images: their size uncompressed (page less its hole) minus as stored, by "
                                        "wal_compression method (pg_get_wal_block_info, PostgreSQL 16+)",
                                        labels=["cluster", "method"])
            stored = CounterMetricFamily("lagwatch_wal_fpi_compressed_bytes", "Compressed full-page image bytes as "
                                         "stored in the inspected WAL, by method", labels=["cluster", "method"])
            images = CounterMetricFamily("lagwatch_wal_fpi_compressed_images", "Compressed full-page images in the "
                                         "inspected WAL, by method", labels=["cluster", "method"])
            for method, (count, stored_bytes, raw_bytes) in sorted(wi.compressed.items()):
                saved.add_metric([c.name, method], max(0, raw_bytes - stored_bytes))
                stored.add_metric([c.name, method], stored_bytes)
                images.add_metric([c.name, method], count)
            yield from (saved, stored, images)


def _one_sample(family: GaugeMetricFamily, key: list[str], value: float) -> GaugeMetricFamily:
    """``family`` with the one sample it has."""
    family.add_metric(key, value)
    return family


def _counter(name: str, doc: str, labels: list[str], key: list[str], value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    family.add_metric(key, value)
    return family


def _fmt_q(q: float) -> str:
    return "1" if q == 1.0 else repr(q)


@functools.lru_cache(maxsize=8)
def _les(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """The le label of each bucket bound (the bounds are the same for every replica)."""
    return tuple("+Inf" if bound == float("inf") else repr(bound) for bound in bounds)


def _pool_metrics(c: ClusterSnapshot) -> Iterator[Family]:
    pool = c.pool
    if pool is None:
        return
    key = [c.name]
    yield _one_sample(_gauge("lagwatch_leader", "1 if this instance holds the cluster's leader lock and applies pool "
                   "changes", ["cluster"]), key, 1.0 if pool.leader else 0.0)
    holder = _gauge("lagwatch_leader_holder_info", "1 for the session holding the cluster's leader lock (this "
                    "instance's own, another lagwatch's, or a stranger's: then no instance applies pool changes)",
                    ["cluster", "pid", "application_name", "user", "lagwatch"])
    if pool.leader_holder is not None:
        h = pool.leader_holder
        holder.add_metric([c.name, str(h.pid), h.application_name, h.user, "true" if h.is_lagwatch else "false"], 1.0)
    yield holder
    yield _one_sample(_gauge("lagwatch_pool_dry_run", "1 if pool changes are decided and counted but not applied",
                   ["cluster"]), key, 1.0 if pool.dry_run else 0.0)
    yield _counter("lagwatch_pool_apply_errors", "Failed attempts to make the pooler match the decision",
                   ["cluster"], key, pool.apply_errors_total)
    yield _counter("lagwatch_pool_read_errors", "Failed attempts to read the pooler's own view of its read pool "
                   "(pooler down, admin console or socket unreachable)", ["cluster"], key, pool.read_errors_total)
    labels = ["cluster", "replica"]
    member = _gauge("lagwatch_pool_member", "1 if lagwatch's decision puts the member (replica, or 'primary' as a "
                "fallback) in the read pool", labels)
    pooler = _gauge("lagwatch_pool_pooler_member", "1 if the pooler itself reports the member in its read pool", labels)
    # Every member ever changed stays (a removed fallback primary reads 0, not absent).
    names = sorted({*pool.reasons, *(pool.members or ()), *(pool.pooler_members or ()),
                    *(member for member, _ in pool.changes_total)})
    for name in names:
        if pool.members is not None:
            member.add_metric([c.name, name], 1.0 if name in pool.members else 0.0)
        if pool.pooler_members is not None:
            pooler.add_metric([c.name, name], 1.0 if name in pool.pooler_members else 0.0)
    yield member
    yield pooler
    changes = CounterMetricFamily("lagwatch_pool_changes", "Pool changes decided, by member and action "
                                  "(eject, readmit, add, remove); counted in dry runs too", labels=labels + ["action"])
    for (name, action), count in sorted(pool.changes_total.items()):
        changes.add_metric([c.name, name, action], count)
    yield changes
    held = _gauge("lagwatch_pool_held", "1 while an operator hold (in or out) overrides automation", labels + ["hold"])
    for name, hold in sorted(pool.holds.items()):
        held.add_metric([c.name, name, hold], 1.0)
    yield held
