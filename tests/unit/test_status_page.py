"""The /status page rendered from canned snapshots: states, escaping, no external assets."""

from __future__ import annotations

import re

from lagwatch.config import ReplicaSla
from lagwatch.estimate.snapshot import ClusterSnapshot, NodeHealth, PoolEvent, PoolStatus, ReplicaState, Snapshot
from lagwatch.estimate.windows import LagHistogram
from lagwatch.serve.status_page import render, sparkline

SLA = ReplicaSla(max_lag=2.0, p95=None, eject_after=2, readmit_below=1.0, readmit_after=3)


def replica(name: str, staleness: float, **kw: object) -> ReplicaState:
    fields: dict[str, object] = {"name": name, "configured": True, "staleness": staleness,
                                 "staleness_source": "replica", "window": None,
                                 "histogram": LagHistogram().snapshot(), "replay_lsn": 1,
                                 "streaming": True, "node_up": True, "replay_pause_state": "not paused",
                                 "samples": tuple((float(t), staleness * t / 10) for t in range(11))}
    fields.update(kw)
    return ReplicaState(**fields)  # type: ignore[arg-type]


def snapshot() -> Snapshot:
    pool = PoolStatus(kind="pgbouncer", leader=True, dry_run=False, members=frozenset({"replica2"}),
                      pooler_members=frozenset({"replica2"}), reasons={"replica1": "staleness 9s > max_lag 2s"},
                      holds={}, changes_total={("replica1", "eject"): 1}, apply_errors_total=0,
                      read_errors_total=0, last_error=None,
                      events=(PoolEvent(1.0e9, "replica1", "eject", "staleness <b>9s</b> > max_lag 2s", 9.0, 3.0,
                                        False),))
    nodes = (NodeHealth("primary", "primary", True, 180000, 0.01, 5, {}, None, {}),
             NodeHealth("replica1", "replica", True, 180000, 0.01, 5, {}, None, {}))
    cluster = ClusterSnapshot("main", 100, None, (replica("replica1", 9.0, replay_pause_state="paused"),
                                                  replica("replica2", 0.0)), None, nodes,
                              slas={"replica1": SLA, "replica2": SLA}, min_replicas=1, pool=pool)
    return Snapshot(1.0e9, 0.004, 5, 0, (cluster,))


def row(page: str, name: str) -> str:
    start = page.index(f'data-replica="{name}"')
    return page[start:page.index("</tr>", start)]


def test_states_pool_and_sla() -> None:
    page = render(snapshot())
    r1, r2 = row(page, "replica1"), row(page, "replica2")
    assert "replay paused" in r1 and "over SLA" in r1 and "out of pool" in r1 and "9s" in r1
    assert "streaming" in r2 and "within SLA" in r2 and "in pool" in r2
    # Each verdict says which rule decided it.
    assert "now 9s &gt; max_lag 2s; no p95 rule" in r1 and "now 0ms ≤ max_lag 2s; no p95 rule" in r2
    assert 'http-equiv="refresh"' in page and 'name="viewport"' in page


def test_no_external_assets_and_everything_escaped() -> None:
    page = render(snapshot())
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "<b>9s</b>" not in page and "&lt;b&gt;9s&lt;/b&gt;" in page


def test_sparkline_draws_sla_and_turns_red_over_it() -> None:
    samples = tuple((float(t), float(t)) for t in range(10))
    svg = sparkline(samples, sla=2.0)
    assert "<polyline" in svg and "stroke-dasharray" in svg and "#cf222e" in svg
    assert "no samples yet" in sparkline((), sla=2.0)


def test_before_first_poll() -> None:
    assert "Waiting for the first poll" in render(None)


def test_p95_sla_breach_shows_and_every_cell_is_labelled_for_phones() -> None:
    from dataclasses import replace

    from lagwatch.estimate.windows import WindowStats

    snap = snapshot()
    cluster = snap.clusters[0]
    strict = ReplicaSla(max_lag=2.0, p95=0.5, eject_after=2, readmit_below=0.4, readmit_after=3)
    window = WindowStats(30, ((0.5, 0.7), (0.95, 0.9), (0.99, 0.9), (1.0, 0.9)))
    replicas = (cluster.replicas[0], replace(cluster.replicas[1], staleness=0.8, window=window))
    cluster = replace(cluster, replicas=replicas, slas={"replica1": SLA, "replica2": strict})
    page = render(replace(snap, clusters=(cluster,)))
    r2 = row(page, "replica2")
    assert "p95 over SLA" in r2 and "now 800ms ≤ max_lag 2s; p95 900ms &gt; 500ms" in r2
    # On a narrow screen each row is a card: every cell says what it is.
    cells = re.findall(r"<td[^>]*>", r2)
    assert len(cells) == 7 and all("data-label=" in c for c in cells)


def test_a_high_p95_beside_within_sla_says_the_verdict_is_on_current_staleness() -> None:
    from lagwatch.serve.status_page import sla_verdict

    loose = ReplicaSla(max_lag=10.0, p95=None, eject_after=2, readmit_below=5.0, readmit_after=3)
    assert sla_verdict(loose, 0.0004, 12.0) == ("within SLA", "ok", "now 0.4ms ≤ max_lag 10s; no p95 rule")
    tight = ReplicaSla(max_lag=0.05, p95=0.02, eject_after=3, readmit_below=0.025, readmit_after=3)
    assert sla_verdict(tight, 0.0072, 0.031) == ("p95 over SLA", "bad", "now 7.2ms ≤ max_lag 50ms; p95 31ms > 20ms")
    assert sla_verdict(tight, 0.063, 0.018)[0:2] == ("over SLA", "bad")
    assert sla_verdict(None, 0.1, None)[0] == "no SLA"


def test_the_quorum_who_is_sync_and_whether_commits_stall() -> None:
    from dataclasses import replace

    from lagwatch.estimate.syncrep import assess
    from lagwatch.views.replication import WalSender

    def sender(name: str, state: str) -> WalSender:
        return WalSender(name, None, "streaming", state, None, 1, 1, 1, 1, 1, 0.001, 0.002, 0.003)

    base = snapshot()
    cluster = base.clusters[0]
    replicas = tuple(replace(r, walsender=sender(r.name, "quorum")) for r in cluster.replicas)
    both = assess("ANY 1 (replica1, replica2)", "on", [sender("replica1", "quorum"), sender("replica2", "quorum")])
    page = render(replace(base, clusters=(replace(cluster, replicas=replicas, sync=both),)))
    assert "synchronous: <b>ANY 1: 2 healthy</b> — sync: replica1, replica2, commit wait 2.0ms" in page
    assert "1 standby(s) to spare" in page
    none = assess("FIRST 2 (replica1, replica2)", "on", [])
    page = render(replace(base, clusters=(replace(cluster, sync=none),)))
    assert "COMMITS STALLED" in page and "FIRST 2: 0 healthy" in page
    unset = assess("", "on", [])
    assert "synchronous:" not in render(replace(base, clusters=(replace(cluster, sync=unset),)))


def test_alert_conditions_and_the_last_role_change_show_with_when_they_fire() -> None:
    from dataclasses import replace

    base = snapshot()
    cluster = replace(base.clusters[0], primaries=2, last_role_change="replica1: replica -> primary (timeline 2)",
                      last_role_change_ago=12.0)
    page = render(replace(base, clusters=(cluster,)))
    assert "last role change: replica1: replica -&gt; primary (timeline 2), 12s ago" in page
    alerts = page[page.index("alert conditions now"):]
    assert alerts.index("LagwatchSplitBrain") < alerts.index("LagwatchReplicaEjected") < alerts.index(
        "LagwatchRoleChanged")
    assert ('<b>LagwatchSplitBrain</b>: 2 servers accept writes <span class="muted">(fires if it holds 15s)'
            in alerts)
    assert "<b>LagwatchRoleChanged</b>: replica1: replica -&gt; primary (timeline 2) 12s ago" in alerts
    assert "fires at once" in alerts
    assert "alert conditions now" not in render(replace(base, clusters=(replace(
        base.clusters[0], pool=None, primaries=1, replicas=base.clusters[0].replicas[1:]),)))


def test_a_fleet_gets_one_line_per_cluster_worst_first_and_a_page_per_cluster() -> None:
    from dataclasses import replace

    from lagwatch.serve.status_page import DETAILED_UP_TO

    base = snapshot()
    healthy = replace(base.clusters[0], pool=None,
                      replicas=tuple(replace(r, replay_pause_state="not paused", staleness=0.0)
                                     for r in base.clusters[0].replicas), primaries=1)
    fleet = [replace(healthy, name=f"c{i:02d}") for i in range(DETAILED_UP_TO + 5)]
    fleet[13] = replace(base.clusters[0], name="c13", primaries=1)  # paused and out of pool: first
    fleet[7] = replace(healthy, name='c07 <"x">', primaries=2)  # split brain: a page, before it
    page = render(replace(base, clusters=tuple(fleet)))
    assert f"<h2>{DETAILED_UP_TO + 5} clusters</h2>" in page and "data-replica" not in page  # no details
    order = re.findall(r'<tr data-cluster="([^"]+)"', page)
    assert order[:2] == ["c07 &lt;&quot;x&quot;&gt;", "c13"] and len(order) == DETAILED_UP_TO + 5
    row = page[page.index('<tr data-cluster="c13"'):]
    row = row[:row.index("</tr>")]
    assert "replica1: replay paused" in row and '<a href="/status?cluster=c13">c13</a>' in row
    assert "ReplicaEjected" in row and "ReplicaReplayPaused" in row
    assert '<a href="/status?cluster=c07%20%3C%22x%22%3E">' in page
    one = render(replace(base, clusters=tuple(fleet)), "c13")
    assert 'data-cluster="c13"' in one and 'data-replica="replica1"' in one and "c14" not in one
    assert "no cluster named c99" in render(replace(base, clusters=tuple(fleet)), "c99")


def test_a_fleet_logs_one_line_per_cycle_naming_only_what_is_wrong() -> None:
    from dataclasses import replace

    from lagwatch.serve.cyclelog import FLEET_LINE_NAMES, fleet_line

    base = snapshot()
    healthy = replace(base.clusters[0], replicas=tuple(replace(r, replay_pause_state="not paused", staleness=0.0)
                                                       for r in base.clusters[0].replicas))
    fleet = [replace(healthy, name=f"c{i:02d}") for i in range(30)]
    fleet[4] = replace(base.clusters[0], name="c04")  # replica1 paused
    fleet[9] = replace(healthy, name="c09", nodes=(replace(healthy.nodes[0], up=False), healthy.nodes[1]))
    line = fleet_line(replace(base, cycle_duration=0.0421, clusters=tuple(fleet)))
    assert line == "30 clusters, 60 replicas in 42ms; 1 not streaming within SLA: c04/replica1 replay paused; " \
                   "down: c09/primary"
    many = [replace(base.clusters[0], name=f"c{i:02d}") for i in range(FLEET_LINE_NAMES + 3)]
    assert line != (crowded := fleet_line(replace(base, clusters=tuple(many))))
    assert crowded.endswith("and 3 more")


def test_the_row_says_why_it_is_behind_escaped() -> None:
    from lagwatch.estimate.diagnosis import Diagnosis
    from lagwatch.estimate.replayload import ReplayLoad

    why = Diagnosis("recovery_conflict", "replay waits on a lock conflict, held by pid 7 (<evil>, ...)",
                    (0.0, 0.0, 0.0, 9.0), (0, 0, 0, 100), (("recovery_conflict", 9.0),), "lock")
    page = render(Snapshot(1.0e9, 0.004, 5, 0, (ClusterSnapshot(
        "main", 100, None, (replica("replica1", 9.0, diagnosis=why, replay_load=ReplayLoad(0.95, 60)),), None,
        (), slas={"replica1": SLA}, min_replicas=1),)))
    r1 = row(page, "replica1")
    assert 'data-cause="recovery_conflict"' in r1 and "held by pid 7 (&lt;evil&gt;" in r1
    assert 'title="replay 9s"' in r1 and "replay busy 95%" in r1


def test_each_reading_says_what_dated_it_and_the_bound_that_held_it() -> None:
    page = render(Snapshot(1.0e9, 0.004, 5, 0, (ClusterSnapshot(
        "main", 100, None, (replica("replica1", 0.2, staleness_evidence="wal_commit", staleness_bound="short_of"),
                            replica("replica2", 0.0, staleness_evidence="caught_up")), None, (),
        slas={"replica1": SLA, "replica2": SLA}, min_replicas=1),)))
    assert "wal_commit, held by short_of" in row(page, "replica1")
    assert "caught_up<" in row(page, "replica2") and "held by" not in row(page, "replica2")
