"""The logical replication families (families.py, "logical replication"): the logical
consumers on a primary, its own subscriptions (a subscriber), and each standby's copies of
its failover slots. Apart from export.py so that neither grows past one job."""

from __future__ import annotations

from lagwatch.estimate.snapshot import ClusterSnapshot
from lagwatch.render import families as f
from lagwatch.render.exposition import quantile_label


def logical_metrics(c: ClusterSnapshot) -> None:
    _logical_metrics(c)
    _subscription_metrics(c)
    _failover_slot_metrics(c)


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


def _subscription_metrics(c: ClusterSnapshot) -> None:
    """The primary's own subscriptions (it is a subscriber)."""
    for sub in c.subscriptions:
        key = [c.name, sub.name]
        f.SUB_ENABLED.add(key, float(sub.enabled))
        f.SUB_WORKER.add(key, float(sub.worker))
        if sub.receipt_age is not None:
            f.SUB_RECEIPT_AGE.add(key, sub.receipt_age)
        if sub.latest_end_age is not None:
            f.SUB_REPORTED_AGE.add(key, sub.latest_end_age)
        if sub.apply_errors is not None:
            f.SUB_APPLY_ERRORS.add(key, sub.apply_errors)
        if sub.sync_errors is not None:
            f.SUB_SYNC_ERRORS.add(key, sub.sync_errors)
        if sub.conflicts:
            f.SUB_CONFLICTS.make().add_metrics(key, sorted(sub.conflicts.items()))


def _failover_slot_metrics(c: ClusterSnapshot) -> None:
    """Each standby's copies of the primary's failover slots (17+): what a promotion keeps."""
    failover = [s.name for s in c.slots if s.failover]
    for r in c.replicas:
        sync = r.slot_sync
        if sync is None:
            continue
        f.SLOT_SYNC_RUNNING.add([c.name, r.name], float(sync.syncing))
        for slot in failover:
            f.SLOT_SYNCED.add([c.name, r.name, slot], float(sync.syncing and slot in sync.synced))
