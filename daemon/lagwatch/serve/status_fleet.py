"""/status for a fleet: one line per cluster, worst first, each linking to its own page."""

from __future__ import annotations

import urllib.parse

from lagwatch.estimate.snapshot import CONDITION_TEXT, ClusterSnapshot, Condition, Snapshot, replica_condition
from lagwatch.render.html import dur as _dur
from lagwatch.render.html import esc as _e
from lagwatch.serve.alerting import conditions

# Above this many clusters /status shows one line per cluster, worst first, each linking to
# its own page (/status?cluster=NAME): a fleet's page of 300 detailed sections would not load.
DETAILED_UP_TO = 20
CONDITION_CSS: dict[Condition, str] = {"down": "bad", "cannot_see": "warn", "not_streaming": "bad", "paused": "warn",
                                       "unknown": "warn", "behind": "warn", "streaming": "ok"}
_CONDITION_ORDER = {c: i for i, c in enumerate(CONDITION_TEXT)}  # worst first


def _worst(c: ClusterSnapshot) -> tuple[int, int, float, str]:
    """How a cluster sorts in the fleet summary: pages first, then by condition, then p95."""
    pages = sum(1 for a in conditions(c) if a.severity == "page")
    worst = min((_CONDITION_ORDER[replica_condition(r, c.slas.get(r.name))] for r in c.replicas),
                default=len(_CONDITION_ORDER))
    p95 = max((r.window.p95 for r in c.replicas if r.window is not None), default=0.0)
    return (-pages, worst, -p95, c.name)


def _summary_row(c: ClusterSnapshot) -> str:
    found = conditions(c)
    staleness = max((r.staleness for r in c.replicas if r.staleness is not None), default=None)
    p95 = max((r.window.p95 for r in c.replicas if r.window is not None), default=None)
    out_of_pool = "" if c.pool is None or c.pool.members is None else str(
        sum(1 for r in c.replicas if r.configured and r.name not in c.pool.members))
    down = sum(1 for n in c.nodes if not n.up)
    alerts = ", ".join(sorted({a.alert.removeprefix("Lagwatch") for a in found}))
    pages = any(a.severity == "page" for a in found)
    link = f'<a href="/status?cluster={urllib.parse.quote(c.name, safe="")}">{_e(c.name)}</a>'
    return (f'<tr data-cluster="{_e(c.name)}"><td data-label="cluster">{link}</td>'
            f'<td data-label="replicas">{_worst_replica(c)}</td>'
            f'<td data-label="primaries" class="num{" bad" if c.primaries != 1 else ""}">{c.primaries}</td>'
            f'<td data-label="staleness" class="num">{_e(_dur(staleness))}</td>'
            f'<td data-label="worst p95" class="num">{_e(_dur(p95))}</td>'
            f'<td data-label="out of pool" class="num">{_e(out_of_pool)}</td>'
            f'<td data-label="nodes down" class="num{" bad" if down else ""}">{down}</td>'
            f'<td data-label="alert conditions" class="{"bad" if pages else "warn" if found else "muted"}">'
            f"{_e(alerts or 'none')}</td></tr>")


def _worst_replica(c: ClusterSnapshot) -> str:
    """The cluster's worst replica and its condition, or that they all stream."""
    if not c.replicas:
        return '<span class="muted">no replicas</span>'
    worst = min(c.replicas, key=lambda r: _CONDITION_ORDER[replica_condition(r, c.slas.get(r.name))])
    condition = replica_condition(worst, c.slas.get(worst.name))
    if condition == "streaming":
        return '<span class="ok">all streaming</span>'
    return f'<span class="{CONDITION_CSS[condition]}">{_e(worst.name)}: {_e(CONDITION_TEXT[condition])}</span>'


def fleet_summary(snapshot: Snapshot) -> str:
    """The fleet's page: one line per cluster, worst first."""
    clusters = sorted(snapshot.clusters, key=_worst)
    rows = "".join(_summary_row(c) for c in clusters)
    troubled = sum(1 for c in clusters if conditions(c))
    return (f'<h2>{len(clusters)} clusters</h2><div class="meta">worst first; {troubled} with alert conditions; '
            f"select one for its replicas, pool and events</div>"
            f'<div class="wrap"><table class="fleet"><thead><tr><th>cluster</th><th>replicas</th><th>primaries</th>'
            f"<th>staleness</th><th>worst p95</th><th>out of pool</th><th>nodes down</th><th>alert conditions</th>"
            f"</tr></thead><tbody>{rows}</tbody></table></div>")
