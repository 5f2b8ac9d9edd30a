"""The snapshot as plain JSON-ready data, for /api/status and `lagwatch check --json`.

It carries no DSNs and so no passwords; LSNs are shown the way PostgreSQL shows them.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from lagwatch.config import ReplicaSla
from lagwatch.estimate.diagnosis import STAGES as DIAGNOSIS_STAGES
from lagwatch.estimate.rates import describe
from lagwatch.estimate.snapshot import (
    ClusterSnapshot,
    LogicalConsumer,
    PoolStatus,
    ReplicaState,
    Snapshot,
    replica_condition,
)
from lagwatch.lsn import format_lsn
from lagwatch.rooms import ROOMS
from lagwatch.serve.alerting import conditions


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def replica_status(r: ReplicaState, sla: ReplicaSla | None = None) -> dict[str, Any]:
    ws = r.walsender
    return {
        "name": r.name,
        "condition": replica_condition(r, sla),
        "configured": r.configured,
        "node_up": r.node_up,
        "follows_primary": r.follows_primary,
        "catch_up": None if r.catch_up is None else {
            "backlog_bytes": r.catch_up.backlog_bytes, "replay_rate_bytes_per_second": r.catch_up.replay_rate,
            "generation_rate_bytes_per_second": r.catch_up.generation_rate,
            # JSON has no infinity: null with falling_behind true.
            "eta_seconds": None if r.catch_up.falling_behind else r.catch_up.eta_seconds,
            "falling_behind": r.catch_up.falling_behind, "summary": describe(r.catch_up)},
        "streaming": r.streaming,
        "staleness_seconds": r.staleness,
        "staleness_source": r.staleness_source,
        "staleness_evidence": r.staleness_evidence,
        "staleness_bound": r.staleness_bound,
        # lagwatch's monotonic clock (seconds): orders readings, means nothing across hosts.
        "staleness_measured_at_monotonic": r.staleness_at,
        "window": None if r.window is None else {"samples": r.window.count,
                                                 **{f"p{int(q * 100)}" if q < 1 else "max": v
                                                    for q, v in r.window.quantiles}},
        "replay_lsn": format_lsn(r.replay_lsn),
        "receive_lsn": format_lsn(r.receive_lsn),
        "receive_replay_bytes": r.receive_replay_bytes,
        "replay_pause_state": r.replay_pause_state,
        "wal_receiver_status": r.wal_receiver_status,
        "last_replay_timestamp_age_seconds": r.last_replay_age_seconds,
        "why": why(r),
        "walsender": None if ws is None else {
            "state": ws.state,
            "sync_state": ws.sync_state,
            "client_addr": ws.client_addr,
            "slot_name": ws.slot_name,
            "lag_bytes": {s: ws.lag_bytes(s) for s in ("sent", "write", "flush", "replay")},
            "lag_seconds": {s: ws.lag_seconds(s) for s in ("write", "flush", "replay")},
        },
    }


def why(r: ReplicaState) -> dict[str, Any] | None:
    """Where the replica's staleness sits and what holds it (diagnosis.py), its replay's
    load and its conflicts; None before a reading."""
    d, load, rec = r.diagnosis, r.replay_load, r.recovery
    if d is None and load is None and rec is None:
        return None
    return {
        "cause": d.cause if d else None,
        "detail": d.detail if d else None,
        # Every cause holding part of the staleness, largest first (the first is ``cause``).
        "causes": [{"cause": c, "seconds": s} for c, s in d.causes] if d else [],
        "stages_seconds": dict(zip(DIAGNOSIS_STAGES, d.stage_seconds, strict=True)) if d else None,
        "stages_bytes": dict(zip(DIAGNOSIS_STAGES, d.stage_bytes, strict=True)) if d else None,
        "conflict": d.conflict if d else None,
        "holders": [{"pid": h.pid, "user": h.user, "state": h.state, "xact_age_seconds": h.xact_age,
                     "holds_the_lock": h.exact, **({"query": h.query} if h.query is not None else {})}
                    for h in (rec.holders if rec else ())],
        "startup_process": None if rec is None or rec.startup_pid is None else {
            "pid": rec.startup_pid, "activity": rec.activity, "wait_event_type": rec.wait_event_type,
            "wait_event": rec.wait_event},
        "replay_busy_ratio": load.busy_ratio if load else None,
        "replay_busy_samples": load.samples if load else 0,
        "startup_read_blocks_per_second": load.read_rate if load else None,
        "recovery_conflicts_total": dict(r.conflicts_total) if rec else None,
    }


def cluster_status(c: ClusterSnapshot) -> dict[str, Any]:
    return {
        "name": c.name,
        "primaries": c.primaries,
        "primary_node": c.primary_node,
        "timeline": c.timeline,
        "role_changes_total": c.role_changes_total,
        "last_role_change": c.last_role_change,
        "last_role_change_ago_seconds": c.last_role_change_ago,
        # Cycles in a row this cluster's state was carried over (lagwatch late for some of its answers).
        "carried_cycles": c.carried_cycles,
        # What the shipped alert rules see now (Prometheus fires each after its for:).
        "alert_conditions": [asdict(a) for a in conditions(c)],
        "primary_lsn": format_lsn(c.primary_lsn),
        "wal_rate_bytes_per_second": c.wal_rate_bytes_per_second,
        "replicas": [replica_status(r, c.slas.get(r.name)) for r in c.replicas],
        # Subscriptions and change-data-capture clients, by slot (logical.py): not replicas.
        "logical_consumers": [logical_status(lc) for lc in c.logical],
        "walinspect": None if c.walinspect is None else asdict(c.walinspect),
        "nodes": [asdict(n) for n in c.nodes],
        "pool": None if c.pool is None else pool_status(c.pool),
        # Each room's part (lagwatch.rooms), under its name.
        **{room.name: room.status(c.rooms.get(room.name)) for room in ROOMS},
        "sync": None if c.sync is None else {
            "standby_names": c.sync.standby_names, "synchronous_commit": c.sync.synchronous_commit,
            "method": c.sync.method, "required": c.sync.required, "healthy": c.sync.healthy,
            "states": c.sync.states, "waits_on_standbys": c.sync.waits_on_standbys, "at_risk": c.sync.at_risk,
            "commit_wait_seconds": c.sync.commit_wait_seconds, "error": c.sync.error},
    }


def logical_status(lc: LogicalConsumer) -> dict[str, Any]:
    return {"slot": lc.slot, "consumer": lc.consumer, "active": lc.active, "state": lc.state,
            "database": lc.database, "plugin": lc.plugin, "position": format_lsn(lc.position),
            "lag_bytes": lc.lag_bytes, "staleness_seconds": lc.staleness, "staleness_evidence": lc.evidence,
            "staleness_measured_at_monotonic": lc.staleness_at,
            "staleness_p95_seconds": lc.window.p95 if lc.window is not None else None}


def pool_status(p: PoolStatus) -> dict[str, Any]:
    return {
        "kind": p.kind,
        "leader": p.leader,
        "leader_holder": None if p.leader_holder is None else {
            "pid": p.leader_holder.pid, "application_name": p.leader_holder.application_name,
            "user": p.leader_holder.user, "client_addr": p.leader_holder.client_addr,
            "this_instance": p.leader_holder.is_us, "lagwatch": p.leader_holder.is_lagwatch},
        "dry_run": p.dry_run,
        "members": None if p.members is None else sorted(p.members),
        "pooler_members": None if p.pooler_members is None else sorted(p.pooler_members),
        "reasons": p.reasons,
        "holds": p.holds,
        "changes_total": [{"member": m, "action": a, "count": n} for (m, a), n in sorted(p.changes_total.items())],
        "apply_errors_total": p.apply_errors_total,
        "read_errors_total": p.read_errors_total,
        "last_error": p.last_error,
        "events": [asdict(e) for e in reversed(p.events)],  # newest first
    }


def snapshot_status(snapshot: Snapshot | None) -> dict[str, Any]:
    if snapshot is None:
        return {"ready": False, "clusters": []}
    cleaned: dict[str, Any] = _clean({
        "ready": True,
        "taken_at": snapshot.taken_at,
        "cycle_duration_seconds": snapshot.cycle_duration,
        "cycles_total": snapshot.cycles_total,
        "overruns_total": snapshot.overruns_total,
        "interval_seconds": snapshot.interval,
        "effective_interval_seconds": snapshot.effective_interval,
        "loop_lag_seconds": snapshot.loop_lag,
        "late_answers_total": snapshot.late_answers_total,
        # Nodes still making their first connection: neither up nor down yet.
        "connecting": [{"cluster": c, "node": n, "state": "connecting"} for c, n in snapshot.connecting],
        "clusters": [cluster_status(c) for c in snapshot.clusters],
    })
    return cleaned
