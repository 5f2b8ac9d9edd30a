"""/status: one server-rendered HTML page from the last snapshot.

No external assets (it must work on an air-gapped host): inline CSS, inline SVG
sparklines, a meta refresh. Readable on a phone. Everything shown is escaped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from lagwatch.config import ReplicaSla
from lagwatch.estimate.diagnosis import STAGES as DIAGNOSIS_STAGES
from lagwatch.estimate.rates import describe
from lagwatch.estimate.snapshot import CONDITION_TEXT, ClusterSnapshot, ReplicaState, Snapshot, replica_condition
from lagwatch.render.html import dur as _dur
from lagwatch.render.html import esc as _e
from lagwatch.rooms import ROOMS
from lagwatch.serve.alerting import conditions
from lagwatch.serve.status_fleet import CONDITION_CSS as _CONDITION_CSS
from lagwatch.serve.status_fleet import DETAILED_UP_TO, fleet_summary

REFRESH_SECONDS = 5

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;padding:12px;
background:#f6f7f9;color:#1d2330}
h1{font-size:1.3em;margin:0 0 4px} h2{font-size:1.1em;margin:18px 0 6px}
.meta{color:#5c6475;font-size:.85em;margin-bottom:8px}
.wrap{overflow-x:auto} table{border-collapse:collapse;width:100%;background:#fff;font-size:.92em}
th,td{padding:6px 8px;border-bottom:1px solid #e3e6eb;text-align:left;white-space:nowrap}
th{background:#eef0f4;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#1a7f37} .warn{color:#9a6700} .bad{color:#cf222e;font-weight:600} .muted{color:#5c6475}
.pill{display:inline-block;padding:1px 7px;border-radius:9px;font-size:.85em;border:1px solid currentColor}
ul.events{background:#fff;padding:8px 8px 8px 26px;margin:0;font-size:.9em} ul.events li{margin:3px 0}
svg.spark{vertical-align:middle}
@media (max-width:640px){body{padding:6px}
 thead{display:none} table,tbody,tr,td{display:block;width:auto} .wrap{overflow-x:visible}
 tr{margin-bottom:8px;border:1px solid #e3e6eb;border-radius:6px;background:#fff}
 td{display:flex;justify-content:space-between;align-items:center;gap:12px;white-space:normal;padding:4px 8px}
 td.num{text-align:right} td::before{content:attr(data-label);color:#5c6475;font-weight:600;font-size:.9em}
 td:first-child{font-weight:600;background:#eef0f4}}
"""




def sparkline(samples: Sequence[tuple[float, float]], sla: float | None, width: int = 140, height: int = 28) -> str:
    """An inline SVG of the window's staleness samples, with the SLA as a dashed line."""
    if len(samples) < 2:
        return f'<svg class="spark" width="{width}" height="{height}" role="img" aria-label="no samples yet"></svg>'
    t0, t1 = samples[0][0], samples[-1][0]
    top = max(max(v for _, v in samples), sla or 0.0, 0.001)
    span = max(t1 - t0, 1e-9)

    def xy(t: float, v: float) -> str:
        return f"{(t - t0) / span * (width - 2) + 1:.1f},{height - 1 - v / top * (height - 2):.1f}"

    points = " ".join(xy(t, v) for t, v in samples)
    over = sla is not None and samples[-1][1] > sla
    parts = [f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="staleness over the window, max {_e(_dur(top))}">']
    if sla is not None and sla <= top:
        y = height - 1 - sla / top * (height - 2)
        parts.append(f'<line x1="0" x2="{width}" y1="{y:.1f}" y2="{y:.1f}" stroke="#cf222e" stroke-width="1" '
                     'stroke-dasharray="3,2"/>')
    parts.append(f'<polyline fill="none" stroke="{"#cf222e" if over else "#0969da"}" stroke-width="1.5" '
                 f'points="{points}"/></svg>')
    return "".join(parts)


def _dated_by(r: ReplicaState) -> str:
    """What dated the reading and the proven bound that held it, if one did (docs/lag.md)."""
    if r.staleness_evidence is None:
        return ""
    held = f", held by {r.staleness_bound}" if r.staleness_bound else ""
    return f'<br><span class="muted dated">{_e(r.staleness_evidence)}{_e(held)}</span>'


def sla_verdict(sla: ReplicaSla | None, staleness: float | None, p95: float | None) -> tuple[str, str, str]:
    """(verdict, css class, the rules it was decided by): a p95 of 12 s must not stand
    beside "within SLA" without saying that the verdict was on current staleness."""
    if staleness is None:
        return "?", "muted", ""
    if sla is None:
        return "no SLA", "muted", ""
    now_over = staleness > sla.max_lag
    rules = [f"now {_dur(staleness)} {'>' if now_over else '≤'} max_lag {_dur(sla.max_lag)}"]
    p95_over = False
    if sla.p95 is None:
        rules.append("no p95 rule")
    elif p95 is not None:
        p95_over = p95 > sla.p95
        rules.append(f"p95 {_dur(p95)} {'>' if p95_over else '≤'} {_dur(sla.p95)}")
    else:
        rules.append(f"p95 ? (limit {_dur(sla.p95)})")
    if now_over:
        return "over SLA", "bad", "; ".join(rules)
    if p95_over:
        return "p95 over SLA", "bad", "; ".join(rules)
    return "within SLA", "ok", "; ".join(rules)


def _replica_row(c: ClusterSnapshot, r: ReplicaState) -> str:
    sla = c.slas.get(r.name)
    max_lag = sla.max_lag if sla else None
    condition = replica_condition(r, sla)
    state, css = CONDITION_TEXT[condition], _CONDITION_CSS[condition]
    p95 = r.window.p95 if r.window else None
    sla_state, sla_css, sla_rules = sla_verdict(sla, r.staleness, p95)
    pool = c.pool
    if pool is None or pool.members is None:
        member, member_css = ("not managed" if pool is None else "unknown"), "muted"
    elif r.name in pool.members:
        member, member_css = "in pool", "ok"
    else:
        member, member_css = "out of pool", "bad"
    if pool is not None and r.name in pool.holds:
        member += f" (held {pool.holds[r.name]})"
    reason = pool.reasons.get(r.name, "") if pool is not None else ""
    unconfigured = "" if r.configured else ' <span class="muted">(not configured)</span>'
    # data-label: on a phone each row becomes a card of "label  value" lines.
    return (
        f'<tr data-replica="{_e(r.name)}"><td data-label="replica">{_e(r.name)}{unconfigured}</td>'
        f'<td data-label="state" class="{css}">{_e(state)}{_catch_up(r)}{_why(r)}</td>'
        f'<td data-label="pool"><span class="pill {member_css}" title="{_e(reason)}">{_e(member)}</span></td>'
        f'<td data-label="staleness" class="num">{_e(_dur(r.staleness))}{_dated_by(r)}</td>'
        f'<td data-label="p95" class="num">{_e(_dur(p95))}</td>'
        f'<td data-label="SLA" class="{sla_css}">'
        f'<span>{_e(sla_state)} <span class="muted">{_e(sla_rules)}</span></span></td>'
        f'<td data-label="window">{sparkline(r.samples, max_lag)}</td></tr>'
    )


def _why(r: ReplicaState) -> str:
    """What holds the replica back and where its staleness sits (diagnosis.py); how busy its
    replay is when that is its limit."""
    d, load = r.diagnosis, r.replay_load
    busy = "" if load is None or load.busy_ratio is None or load.busy_ratio < 0.5 else \
        f' <span class="muted">replay busy {load.busy_ratio:.0%}</span>'
    if d is None or d.cause == "caught_up":
        return f"<br>{busy}" if busy else ""
    stages = ", ".join(f"{name} {_dur(seconds)}" for name, seconds in zip(DIAGNOSIS_STAGES, d.stage_seconds,
                                                                          strict=True) if seconds > 0)
    return (f'<br><span class="why" data-cause="{_e(d.cause)}" title="{_e(stages)}"><b>{_e(d.cause)}</b>: '
            f'{_e(d.detail)}</span>{busy}')


def _catch_up(r: ReplicaState) -> str:
    if r.catch_up is None or r.catch_up.eta_seconds == 0.0:
        return ""
    css = "bad" if r.catch_up.falling_behind else "muted"
    return f'<br><span class="{css} catchup">{_e(describe(r.catch_up))}</span>'


def _node_role(role: str, timeline: int | None) -> str:
    return role + (f" (timeline {timeline})" if timeline is not None else "")


def _sync_line(c: ClusterSnapshot) -> str:
    """Synchronous replication: the quorum, who is sync, and whether commits can complete."""
    s = c.sync
    if s is None or (s.method is None and not s.error):
        return ""
    if s.error:
        return f'<div class="meta sync">synchronous_standby_names: <span class="bad">{_e(s.error)}</span></div>'
    named = {r.walsender.application_name: r.name for r in c.replicas if r.walsender is not None}
    sync = sorted(named.get(n, n) for n, state in s.states.items() if state in ("sync", "quorum"))
    what = f"{'ANY' if s.method == 'quorum' else 'FIRST'} {s.required}: {s.healthy} healthy"
    if not s.waits_on_standbys:
        verdict = f'<span class="ok">commits do not wait (synchronous_commit = {_e(s.synchronous_commit)})</span>'
    elif s.at_risk:
        verdict = '<span class="bad">COMMITS STALLED: fewer healthy standbys than required</span>'
    elif s.spare == 0:
        verdict = '<span class="warn">one more loss stalls commits</span>'
    else:
        verdict = f'<span class="ok">{s.spare} standby(s) to spare</span>'
    wait = f", commit wait {_dur(s.commit_wait_seconds)}" if s.commit_wait_seconds is not None else ""
    return (f'<div class="meta sync">synchronous: <b>{_e(what)}</b> — sync: {_e(", ".join(sync) or "none")}'
            f"{_e(wait)} — {verdict}</div>")


def _compression_line(c: ClusterSnapshot) -> str:
    """What wal_compression saved since lagwatch started, of the WAL it inspected."""
    wi = c.walinspect
    if wi is None or not wi.compressed or not wi.inspected_bytes:
        return ""
    saved = sum(max(0, raw - stored) for _, stored, raw in wi.compressed.values())
    methods = ", ".join(sorted(wi.compressed))
    share = saved / (wi.inspected_bytes + saved)
    return (f'<div class="meta compression">WAL compression ({_e(methods)}): saved {share:.0%} of the WAL '
            f"full-page images would have made ({saved / 2**20:.1f} MiB since start)</div>")



def _logical_line(c: ClusterSnapshot) -> str:
    """The logical consumers (subscriptions, CDC clients), apart from the replicas."""
    if not c.logical:
        return ""
    items = ", ".join(
        f'<span class="{"" if lc.active else "bad"}" data-slot="{_e(lc.slot)}">{_e(lc.consumer)} '
        f'<span class="muted">(slot {_e(lc.slot)})</span>: '
        f'{_e(_dur(lc.staleness))}'
        f'{"" if lc.active else " not connected"}</span>' for lc in c.logical)
    return f'<div class="meta logical">logical consumers (never in a pool): {items}</div>'


_SEVERITY_CSS = {"page": "bad", "warning": "warn", "info": "muted"}


def _fires(for_seconds: float) -> str:
    return "fires at once" if not for_seconds else f"fires if it holds {_dur(for_seconds)}"


def _alerts_line(c: ClusterSnapshot) -> str:
    """What the shipped alert rules see now: each fires once its for: has passed."""
    found = conditions(c)
    if not found:
        return ""
    items = "".join(
        f'<li><span class="pill {_SEVERITY_CSS[a.severity]}">{_e(a.severity)}</span> <b>{_e(a.alert)}</b>: '
        f'{_e(a.text)} <span class="muted">({_e(_fires(a.for_seconds))})</span></li>' for a in found)
    return f'<h3 class="meta">alert conditions now</h3><ul class="events alerts">{items}</ul>'


def _cluster(c: ClusterSnapshot) -> str:
    rows = "".join(_replica_row(c, r) for r in c.replicas)
    return (f'<section data-cluster="{_e(c.name)}"><h2>{_e(c.name)}</h2><div class="meta">nodes: {_nodes_line(c)}</div>'
            f"{_sync_line(c)}{_logical_line(c)}{_compression_line(c)}{_rooms_lines(c)}{_pool_line(c)}"
            f"{_alerts_line(c)}"
            f"<div class=\"wrap\"><table><thead><tr><th>replica</th><th>state</th><th>pool</th><th>staleness</th>"
            f"<th>p95</th><th>SLA</th><th>window</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div>{_events(c)}</section>")


def _rooms_lines(c: ClusterSnapshot) -> str:
    """Each room's line (lagwatch.rooms), in their order."""
    return "".join(room.page(c.rooms.get(room.name)) for room in ROOMS)


def _nodes_line(c: ClusterSnapshot) -> str:
    nodes = ", ".join(f'<span class="{"ok" if n.up else "bad"}">{_e(n.name)} '
                      f'{_e(_node_role(n.observed_role, n.timeline)) if n.up else "down"}</span>' for n in c.nodes)
    if c.primaries >= 2:
        nodes += f' — <span class="bad">split brain: {c.primaries} servers accept writes</span>'
    elif c.primaries == 0:
        nodes += ' — <span class="bad">no primary answers</span>'
    if c.last_role_change is not None and c.last_role_change_ago is not None:
        nodes += f' — last role change: {_e(c.last_role_change)}, {_e(_dur(c.last_role_change_ago))} ago'
    return nodes


def _pool_line(c: ClusterSnapshot) -> str:
    pool = c.pool
    if pool is None:
        return ""
    members = ", ".join(sorted(pool.members)) if pool.members is not None else "unknown"
    flags = [pool.kind, "leader" if pool.leader else "standby (not applying)"] + (["dry run"] if pool.dry_run else [])
    line = f'<div class="meta">read pool: <b>{_e(members or "(empty)")}</b> — {_e(", ".join(flags))}'
    holder = pool.leader_holder
    if holder is not None and not holder.is_us:
        who = f"leader lock held by {holder.describe()}"
        line += (f" — {_e(who)} (another lagwatch)" if holder.is_lagwatch else
                 f' — <span class="bad">{_e(who)}: not lagwatch, no instance applies pool changes</span>')
    if pool.last_error:
        line += f' — <span class="bad">{_e(pool.last_error)}</span>'
    return line + "</div>"


def _events(c: ClusterSnapshot) -> str:
    if c.pool is None:
        return ""
    items = "".join(
        f"<li>{_e(time.strftime('%H:%M:%S', time.localtime(e.at)))} <b>{_e(e.action)}</b> {_e(e.member)}"
        f"{' (dry run)' if e.dry_run else ''}: {_e(e.reason)}</li>" for e in reversed(c.pool.events[-15:]))
    return f'<h3 class="meta">recent pool events</h3><ul class="events">{items or "<li>none yet</li>"}</ul>'


def _daemon_line(snapshot: Snapshot, cluster: str | None) -> str:
    """lagwatch's own trouble, when it has some: nodes still connecting (neither up nor down
    yet), and an interval stretched because its cycles do not fit the configured one."""
    parts = []
    connecting = [f"{c}/{n}" for c, n in snapshot.connecting if cluster in (None, c)]
    if connecting:
        more = f" and {len(connecting) - 10} more" if len(connecting) > 10 else ""
        parts.append(f'<span class="warn">connecting: {_e(", ".join(connecting[:10]))}{_e(more)}</span> '
                     f'(first connection under way: neither up nor down yet)')
    if snapshot.effective_interval > snapshot.interval:
        parts.append(f'<span class="warn">overloaded: polling every {_e(_dur(snapshot.effective_interval))} instead '
                     f'of {_e(_dur(snapshot.interval))}</span> (cycles do not fit the interval; loop lag '
                     f'{_e(_dur(snapshot.loop_lag))})')
    carried = [c.name for c in snapshot.clusters if c.carried_cycles and cluster in (None, c.name)]
    if carried:
        parts.append(f'<span class="warn">as of an earlier cycle: {_e(", ".join(carried[:10]))}'
                     f'{_e(f" and {len(carried) - 10} more" if len(carried) > 10 else "")}</span> '
                     f"(lagwatch got to some of their answers too late to count them)")
    return "".join(f'<div class="meta lagwatch">{part}</div>' for part in parts)


def render(snapshot: Snapshot | None, cluster: str | None = None) -> str:
    """The page: every cluster in detail, or for more than DETAILED_UP_TO clusters a summary
    line per cluster; ``cluster``: that one cluster in detail (``/status?cluster=NAME``)."""
    if snapshot is None:
        body = '<p class="muted">Waiting for the first poll…</p>'
        stamp = ""
    else:
        if cluster is not None:
            chosen = [c for c in snapshot.clusters if c.name == cluster]
            body = ('<div class="meta"><a href="/status">all clusters</a></div>'
                    + ("".join(_cluster(c) for c in chosen) or f'<p class="bad">no cluster named {_e(cluster)}</p>'))
        elif len(snapshot.clusters) > DETAILED_UP_TO:
            body = fleet_summary(snapshot)
        else:
            body = "".join(_cluster(c) for c in snapshot.clusters)
        body = _daemon_line(snapshot, cluster) + body
        stamp = (f"as of {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(snapshot.taken_at))}, "
                 f"cycle {snapshot.cycle_duration * 1000:.1f} ms")
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}"><title>lagwatch status</title>'
            f"<style>{_CSS}</style></head><body><h1>lagwatch</h1>"
            f'<div class="meta">{_e(stamp)} · refreshes every {REFRESH_SECONDS}s · '
            f'<a href="/metrics">metrics</a> · <a href="/api/status">json</a></div>{body}</body></html>')
