"""See it and get paged, end to end, with every component real:

two real clusters (primary + 2 replicas each) -> one lagwatch (PgBouncer pool control on
both) -> Prometheus (Debian's) scraping it and evaluating the shipped rules -> Alertmanager
configured from the shipped example -> a webhook served by this test. Plus the shipped
dashboard's queries against that Prometheus, and the status page in headless Chromium.

Cluster ``main`` gets replica1's replay paused under writes; cluster ``idle`` gets no writes
at all for the same duration, and must not make a single replica alert even go pending.

What the tests wait on is the product's path to the pager, not production's patience:
every ``for:`` FOR_FACTOR times shorter (at least FOR_FLOOR; promtool's tests hold the
shipped ones), Prometheus evaluating and Alertmanager grouping sooner (quick_alerting.py).

One version (the first): what is shown is the path from lagwatch's metrics and pages to
Prometheus, Alertmanager and a browser, which no server version changes; the views each
major reads are test_versions.py's.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from chaoscluster import ChaosCluster
from harness import ROOT, Lagwatch, Writer, chromium, cluster_config
from lagwatch.demo.binaries import find_binaries
from lagwatch.demo.ports import free_port
from pgbouncer_server import PgBouncerServer, readable_by_servers
from prom_stack import Alertmanager, Prometheus, WebhookReceiver, alertmanager_config, rules_with_shorter_for
from quick_alerting import evaluate_every, quicker_grouping

ARTIFACTS = ROOT / "test-artifacts"
RULES = ROOT / "alerts" / "lagwatch.rules.yml"
FOR_FACTOR = 40  # the shipped for:s, 40 times shorter (prom_stack.rules_with_shorter_for) ...
FOR_FLOOR = 3.0  # ... and at least 3 s: a pending state the tests' sampling (every 0.2 s) sees
SLA = {"max_lag": "1s", "eject_after": 2, "readmit_below": "500ms", "readmit_after": 3, "min_replicas": 1}


pytestmark = pytest.mark.one_pg_version


@dataclass
class Stack:
    cluster: ChaosCluster
    idle_cluster: ChaosCluster
    lagwatch: Lagwatch
    prometheus: Prometheus
    alertmanager: Alertmanager
    webhook: WebhookReceiver


def pooled_cluster(name: str, cluster: ChaosCluster, pgbouncer: PgBouncerServer) -> dict[str, Any]:
    """One ``clusters[]`` entry, with PgBouncer pool control over both replicas."""
    r1, r2 = cluster.replicas
    pgbouncer.include_file.write_text(f"app_ro = host={r1.host},{r2.host} port={r1.port} dbname=postgres\n")
    readable_by_servers(pgbouncer.include_file)
    return {
        "name": name,
        "primary": {"dsn": cluster.primary.dsn()},
        "replicas": [{"name": r.name, "dsn": r.dsn()} for r in cluster.replicas],
        "sla": SLA,
        "pooler": {"kind": "pgbouncer", "admin_dsn": pgbouncer.admin_dsn, "include_file": str(pgbouncer.include_file),
                   "database": "app_ro", "options": f"port={r1.port} dbname=postgres"},
    }


@pytest.fixture(scope="module")
def stack(pg_cluster: ChaosCluster, pg_major: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("e2e")
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]), window="1m", state_dir=str(workdir / "state"))
    with contextlib.ExitStack() as started:
        idle_cluster = started.enter_context(ChaosCluster(find_binaries(pg_major), replicas=2))
        config["clusters"] = []
        for name, cluster in (("main", pg_cluster), ("idle", idle_cluster)):
            pgbouncer = PgBouncerServer(primary_dsn_entry=f"host=127.0.0.1 port={cluster.primary.port} dbname=postgres")
            config["clusters"].append(pooled_cluster(name, cluster, pgbouncer))  # writes its include file
            started.enter_context(pgbouncer)
        webhook = started.enter_context(WebhookReceiver())
        alertmanager = Alertmanager(quicker_grouping(alertmanager_config(webhook)))
        started.callback(alertmanager.stop)
        alertmanager.start()
        lagwatch = Lagwatch(workdir, config)
        started.callback(lagwatch.stop)
        lagwatch.wait_ready()
        # The shipped rules with every for: FOR_FACTOR times shorter (2m, 30s and 15s page after
        # 3 s): promtool's tests hold the real for:s; here the path to the pager is what is shown.
        rules = rules_with_shorter_for(RULES, workdir, FOR_FACTOR, floor=FOR_FLOOR)
        prometheus = Prometheus([f"127.0.0.1:{lagwatch.port}"], [rules], alertmanager.address)
        evaluate_every(prometheus)
        started.callback(prometheus.stop)
        prometheus.start()
        yield Stack(pg_cluster, idle_cluster, lagwatch, prometheus, alertmanager, webhook)


def epoch(stamp: str) -> float:
    """An RFC 3339 time of Prometheus's or Alertmanager's (nanoseconds, "Z"), as time.time()."""
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", stamp).replace("Z", "+00:00")).timestamp()


class AlertStates:
    """Every (cluster, alertname, replica, state) Prometheus reported, sampled while waiting:
    "pending" counts, so a rule that would fire after its ``for:`` is caught long before.
    Each with when it became active (Prometheus's activeAt), to tell one a test made from
    one still active from an earlier test (the module's order may be reversed)."""

    def __init__(self, prometheus: Prometheus) -> None:
        self.prometheus = prometheus
        self.seen: set[tuple[str, str, str, str]] = set()
        self.active_at: dict[tuple[str, str, str, str], float] = {}

    def sample(self) -> None:
        for alert in self.prometheus.alerts():
            labels = alert["labels"]
            key = (labels.get("cluster", ""), labels["alertname"], labels.get("replica", ""), alert["state"])
            self.seen.add(key)
            self.active_at.setdefault(key, epoch(alert["activeAt"]))

    def of(self, cluster: str, since: float = 0.0) -> set[tuple[str, str, str, str]]:
        """What ``cluster`` showed, of the alerts that became active at ``since`` (time.time()) or later."""
        return {s for s in self.seen if s[0] == cluster and self.active_at[s] >= since}


def wait(what: str, predicate: Any, timeout: float, every: float = 0.2,
         meanwhile: Callable[[], None] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if meanwhile is not None:
            meanwhile()
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def status_dom(stack: Stack) -> str:
    result = chromium("--dump-dom", stack.lagwatch.url("/status"))
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def replica_row(dom: str, replica: str, cluster: str = "main") -> str:
    section = dom.index(f'data-cluster="{cluster}"')
    start = dom.index(f'data-replica="{replica}"', section)
    return dom[start:dom.index("</tr>", start)]


def screenshot(stack: Stack, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    result = chromium("--window-size=412,915", f"--screenshot={path}", stack.lagwatch.url("/status"))
    assert result.returncode == 0 and path.stat().st_size > 1000, result.stderr[-2000:]
    return path


def test_status_page_in_chromium_healthy(stack: Stack) -> None:
    """First: Prometheus, started with the stack, scrapes meanwhile what the dashboard test reads.
    Healthy: every replica in its pool (in reversed order the paused test comes before, and
    lagwatch readmits its replica readmit_after cycles after it caught up)."""
    for cluster in ("main", "idle"):
        for replica in ("replica1", "replica2"):
            stack.lagwatch.expect("lagwatch_pool_member", 1, timeout=30, cluster=cluster, replica=replica)
    dom = status_dom(stack)
    for cluster in ("main", "idle"):
        for replica in ("replica1", "replica2"):
            row = replica_row(dom, replica, cluster)
            assert "streaming" in row and "in pool" in row and "<svg" in row
    assert "http://" not in dom.replace(stack.lagwatch.url(""), "")  # no external assets
    screenshot(stack, "status-healthy.png")


def test_dashboard_queries_run_against_prometheus(stack: Stack) -> None:
    sys.path.insert(0, str(ROOT / "dashboards"))
    import generate  # the shipped dashboard's generator

    wait("lagwatch scraped", lambda: stack.prometheus.query("lagwatch_up")["data"]["result"], timeout=30)
    failed: list[tuple[str, str, object]] = []
    empty: list[tuple[str, str]] = []

    def every_panel_has_data() -> bool:
        # A rate needs two scrapes in its range: until then its panel is empty, so wait
        # for Prometheus to have them rather than for a number of seconds.
        failed.clear()
        empty.clear()
        for title, expr, must_have_data in generate.panel_queries():
            answer = stack.prometheus.query(generate.substitute(expr, cluster="main", replica=".*", interval="5s"))
            if answer.get("status") != "success":
                failed.append((title, expr, answer.get("error")))
            elif must_have_data and not answer["data"]["result"]:
                empty.append((title, expr))
        return not failed and not empty

    with contextlib.suppress(AssertionError):
        wait("every panel with data", every_panel_has_data, timeout=30, every=0.5)
    assert not failed, f"panel queries Prometheus refused: {failed}"
    assert not empty, f"panels without data on a healthy cluster: {empty}"


def test_paused_replica_pages_then_resolves_idle_cluster_stays_silent(stack: Stack) -> None:
    """Judged over this test's span: whatever an earlier test left active (the module's
    order may be reversed, and the tests that break things break cluster idle) is not what
    the idle cluster made while main's replica was paused."""
    lw = stack.lagwatch
    stack.idle_cluster.wait_replayed()
    for replica in ("replica1", "replica2"):  # readmitted, if an earlier test had it out
        lw.expect("lagwatch_pool_member", 1, timeout=30, cluster="idle", replica=replica)
    ejected = {r: lw.value("lagwatch_pool_changes_total", cluster="idle", replica=r, action="eject") or 0
               for r in ("replica1", "replica2")}
    began = time.time()  # on the clock Prometheus and Alertmanager date alerts by
    states = AlertStates(stack.prometheus)
    replica1 = stack.cluster.replicas[0]
    replica1.pause_replay()
    with Writer(stack.cluster, every=0.2, max_seconds=240):
        # Ejected from the pool within a few cycles: the status page says so.
        stack.lagwatch.wait_for("replica1 ejected",
                                lambda: stack.lagwatch.value("lagwatch_pool_member", replica="replica1") == 0,
                                timeout=20)
        row = replica_row(status_dom(stack), "replica1")
        assert "out of pool" in row and "replay paused" in row and "over SLA" in row
        screenshot(stack, "status-replica1-ejected.png")

        def paged() -> list[dict[str, Any]]:
            return [a for n in stack.webhook.notifications("/pager") if n["status"] == "firing"
                    for a in n["alerts"] if a["labels"].get("replica") == "replica1" and epoch(a["startsAt"]) >= began]

        wait("a page for replica1", paged, timeout=200, meanwhile=states.sample)
    alert = paged()[0]
    assert alert["labels"]["cluster"] == "main" and alert["labels"]["severity"] == "page"
    summary = alert["annotations"]["summary"]
    assert "replica1" in summary and "main" in summary, summary
    assert alert["annotations"].get("runbook_url", "").endswith(".md")

    replica1.resume_replay()

    def resolved() -> bool:
        return any(n["status"] == "resolved" and any(a["labels"].get("alertname") == alert["labels"]["alertname"]
                                                     and a["labels"].get("replica") == "replica1"
                                                     for a in n["alerts"])
                   for n in stack.webhook.notifications("/pager"))

    wait("the resolved notification", resolved, timeout=180, meanwhile=states.sample)

    # The sampling saw main's page come on, pending then firing: the same Prometheus held
    # its condition for a whole for: while it watched the idle cluster too ...
    for state in ("pending", "firing"):
        assert ("main", alert["labels"]["alertname"], "replica1", state) in states.seen, states.of("main")
    # ... and over that time the idle cluster made no alert, pending or firing, and sent nothing.
    # Only its inactive slot may show (it holds WAL: true, and warned about after 30 minutes).
    made = {s for s in states.of("idle", since=began) if s[1] != "LagwatchSlotInactive"}
    assert made == set(), states.of("idle")
    sent_for_idle = [a["labels"] for n in stack.webhook.notifications() for a in n["alerts"]
                     if a["labels"].get("cluster") == "idle" and epoch(a["startsAt"]) >= began]
    assert sent_for_idle == []
    # The idle cluster's replicas stayed in its pool, at no lag.
    for replica in ("replica1", "replica2"):
        assert lw.value("lagwatch_pool_member", cluster="idle", replica=replica) == 1
        assert (lw.value("lagwatch_pool_changes_total", cluster="idle", replica=replica, action="eject") or 0) \
            == ejected[replica]


def test_a_stranger_holding_the_leader_lock_is_named_and_alerted(stack: Stack) -> None:
    """An ordinary login (no grants at all) that calls itself lagwatch-leader, as lagwatch's
    own lock session does, takes cluster idle's leader lock the moment lagwatch's lock
    session goes away: it is not taken for another lagwatch (it does not run as lagwatch's
    role); lagwatch says who holds it (metric, log, /status), the shipped alert's
    expression holds on the real Prometheus, and decisions are logged as not applied. When
    the stranger lets go, lagwatch leads again."""
    import psycopg
    from lagwatch.act.leader import lock_key

    primary = stack.idle_cluster.primary
    lw = stack.lagwatch
    wait("lagwatch leads idle", lambda: lw.value("lagwatch_leader", cluster="idle") == 1, timeout=20)
    primary.execute("DROP ROLE IF EXISTS mallory")
    primary.execute("CREATE ROLE mallory LOGIN")
    stranger = psycopg.connect(primary.dsn(user="mallory") + " application_name=lagwatch-leader", autocommit=True)
    try:
        taken = False
        deadline = time.monotonic() + 15
        while not taken and time.monotonic() < deadline:
            primary.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name = 'lagwatch-leader' AND usename <> 'mallory'")
            for _ in range(200):  # before lagwatch's next cycle takes it back
                row = stranger.execute("SELECT pg_try_advisory_lock(%s, %s)", lock_key("idle")).fetchone()
                if row and row[0]:
                    taken = True
                    break
                time.sleep(0.002)
        assert taken, "the stranger never got the lock"
        pid = stranger.info.backend_pid
        holder = {"cluster": "idle", "pid": str(pid), "application_name": "lagwatch-leader", "user": "mallory",
                  "lagwatch": "false"}
        wait("lagwatch names the stranger", lambda: lw.value("lagwatch_leader_holder_info", **holder) == 1,
             timeout=20)
        assert lw.value("lagwatch_leader", cluster="idle") == 0
        states = AlertStates(stack.prometheus)
        wait("LagwatchPoolControlNotApplied for idle on Prometheus",
             lambda: ("idle", "LagwatchPoolControlNotApplied", "", "pending") in states.of("idle")
             or ("idle", "LagwatchPoolControlNotApplied", "", "firing") in states.of("idle"),
             timeout=30, meanwhile=states.sample)

        def paged() -> list[dict[str, Any]]:
            return [a for n in stack.webhook.notifications("/pager") if n["status"] == "firing"
                    for a in n["alerts"] if a["labels"].get("alertname") == "LagwatchPoolControlNotApplied"
                    and a["labels"].get("cluster") == "idle"]

        wait("the page for it, through Alertmanager", paged, timeout=60)
        assert "held by a session that is not lagwatch: pid" in paged()[0]["annotations"]["description"], paged()
        pool = next(c for c in lw.status()["clusters"] if c["name"] == "idle")["pool"]
        assert pool["leader_holder"]["pid"] == pid and pool["leader_holder"]["lagwatch"] is False, pool
        page = lw.get("/status")[1]
        assert f"leader lock held by pid {pid}" in page and "not lagwatch, no instance applies pool changes" in page
        # Said once (a decision meanwhile is logged by the pool as NOT APPLIED, naming it too).
        warnings = [line for line in lw.log_text().splitlines()
                    if "WARNING lagwatch.act.leader:" in line and "held by a session that is not lagwatch" in line]
        assert len(warnings) == 1 and f"pid {pid}" in warnings[0] and "'mallory'" in warnings[0], warnings
    finally:
        stranger.close()
    wait("lagwatch leads idle again", lambda: lw.value("lagwatch_leader", cluster="idle") == 1, timeout=20)
    assert lw.value("lagwatch_leader_holder_info", cluster="idle", pid=str(pid), application_name="lagwatch-leader",
                    user="mallory", lagwatch="false") is None


def test_a_replica_promoted_beside_a_running_primary_pages_as_split_brain(stack: Stack) -> None:
    """replica2 of cluster idle promoted while its primary runs: two writers. lagwatch counts
    them, the shipped LagwatchSplitBrain rule fires on the real Prometheus and the page
    reaches the pager receiver through Alertmanager; the role change goes to chat."""
    lw = stack.lagwatch
    replica2 = stack.idle_cluster.replicas[1]
    try:
        replica2.promote()
        lw.wait_for("two primaries", lambda: lw.value("lagwatch_cluster_primaries", cluster="idle") == 2, timeout=10)
        states = AlertStates(stack.prometheus)
        wait("LagwatchSplitBrain firing for idle", lambda: ("idle", "LagwatchSplitBrain", "", "firing") in states.seen,
             timeout=60, meanwhile=states.sample)

        def sent(receiver: str, alertname: str) -> list[dict[str, Any]]:
            return [a for n in stack.webhook.notifications(receiver) if n["status"] == "firing"
                    for a in n["alerts"] if a["labels"].get("alertname") == alertname
                    and a["labels"].get("cluster") == "idle"]

        wait("the split-brain page", lambda: sent("/pager", "LagwatchSplitBrain"), timeout=60)
        page = sent("/pager", "LagwatchSplitBrain")[0]
        assert page["labels"]["severity"] == "page"
        assert page["annotations"]["summary"] == "Split brain: 2 servers of cluster idle accept writes"
        wait("the role change, for the record", lambda: sent("/chat", "LagwatchRoleChanged"), timeout=60)
        # The main cluster saw none of it.
        assert not [s for s in states.of("main") if s[1] in ("LagwatchSplitBrain", "LagwatchRoleChanged")]
    finally:
        stack.idle_cluster.heal()  # re-clones the promoted replica


def test_synchronous_standbys_all_gone_pages_as_stalled_commits(stack: Stack) -> None:
    """Cluster idle's primary asks for ANY 1 of its two replicas, synchronously; both are
    stopped: lagwatch reads commits at risk, the shipped LagwatchSyncCommitsStalled rule fires
    on the real Prometheus after its 30 s and the page reaches the pager receiver."""
    lw, cluster = stack.lagwatch, stack.idle_cluster
    r1, r2 = cluster.replicas
    try:
        names = f"ANY 1 ({r1.application_name}, {r2.application_name})"
        cluster.primary.alter_system("synchronous_standby_names", names)
        cluster.primary.reload()
        lw.expect("lagwatch_sync_standbys_healthy", 2, timeout=10, cluster="idle")
        r1.stop()
        r2.stop()
        lw.expect("lagwatch_sync_commit_at_risk", 1, timeout=10, cluster="idle")

        def paged() -> list[dict[str, Any]]:
            return [a for n in stack.webhook.notifications("/pager") if n["status"] == "firing"
                    for a in n["alerts"] if a["labels"].get("alertname") == "LagwatchSyncCommitsStalled"]

        wait("the stalled-commits page", paged, timeout=90)
        page = paged()[0]
        assert page["labels"]["cluster"] == "idle" and page["labels"]["severity"] == "page"
        assert page["annotations"]["summary"] == "Commits stall on cluster idle: too few synchronous standbys"
    finally:
        cluster.heal()  # starts the replicas, resets synchronous_standby_names
