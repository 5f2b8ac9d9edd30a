"""What a cycle says in the log (and in systemd's status line): one line per cluster while
they are few, one line for the whole fleet when they are many. Pure: a snapshot in, text out.
"""

from __future__ import annotations

import logging

from lagwatch.durations import format_duration
from lagwatch.estimate.snapshot import CONDITION_TEXT, ClusterSnapshot, Snapshot, replica_condition

log = logging.getLogger("lagwatch.daemon")

CLUSTER_LINES_UP_TO = 5  # more clusters than this log one INFO line per cycle, not one per cluster
FLEET_LINE_NAMES = 10  # replicas and nodes a fleet's cycle line names before "and N more"


def log_cycle(snapshot: Snapshot) -> None:
    """One INFO line per cluster and cycle for a few clusters; for a fleet one line per
    cycle that names only what is wrong (the per-cluster lines go to DEBUG)."""
    few = len(snapshot.clusters) <= CLUSTER_LINES_UP_TO
    level = logging.INFO if few else logging.DEBUG
    if log.isEnabledFor(level):
        for c in snapshot.clusters:
            log.log(level, "%s", cycle_line(c))
    if log.isEnabledFor(logging.DEBUG):
        for c in snapshot.clusters:
            for node in c.nodes:
                if not node.up:
                    log.debug("%s/%s down: %s", c.name, node.name, node.last_error)
    if not few:
        log.info("%s", fleet_line(snapshot))


def status_line(snapshot: Snapshot) -> str:
    """systemd's STATUS= for this cycle: the clusters' lines, or the fleet's."""
    if len(snapshot.clusters) <= CLUSTER_LINES_UP_TO:
        return "; ".join(cycle_line(c) for c in snapshot.clusters)
    return fleet_line(snapshot)


def fleet_line(snapshot: Snapshot) -> str:
    """The one INFO line per cycle for a fleet: its size, then what is wrong, in cluster order."""
    replicas = [(c, r) for c in snapshot.clusters for r in c.replicas]
    conditions = [(f"{c.name}/{r.name}", replica_condition(r, c.slas.get(r.name))) for c, r in replicas]
    wrong = [(name, condition) for name, condition in conditions if condition != "streaming"]
    down = [f"{c.name}/{n.name}" for c in snapshot.clusters for n in c.nodes if not n.up]
    took = format_duration(snapshot.cycle_duration)
    parts = [f"{len(snapshot.clusters)} clusters, {len(replicas)} replicas in {took}"]
    if wrong:
        shown = ", ".join(f"{name} {CONDITION_TEXT[condition]}" for name, condition in wrong[:FLEET_LINE_NAMES])
        more = f" and {len(wrong) - FLEET_LINE_NAMES} more" if len(wrong) > FLEET_LINE_NAMES else ""
        parts.append(f"{len(wrong)} not streaming within SLA: {shown}{more}")
    if down:
        more = f" and {len(down) - FLEET_LINE_NAMES} more" if len(down) > FLEET_LINE_NAMES else ""
        parts.append(f"down: {', '.join(down[:FLEET_LINE_NAMES])}{more}")
    return "; ".join(parts)


def cycle_line(c: ClusterSnapshot) -> str:
    """The one INFO line per cycle: enough to read the cluster's health at a glance."""
    parts = []
    for r in c.replicas:
        lag = "?" if r.staleness is None else format_duration(r.staleness)
        p95 = "?" if r.window is None else format_duration(r.window.p95)
        condition = replica_condition(r, c.slas.get(r.name))
        flag = "" if condition == "streaming" else " " + CONDITION_TEXT[condition].upper().replace(" ", "-")
        parts.append(f"{r.name}={lag} (p95 {p95}){flag}")
    down = [n.name for n in c.nodes if not n.up]
    tail = f"; down: {', '.join(down)}" if down else ""
    return f"{c.name}: " + (", ".join(parts) or "no replicas") + tail
