"""Every PostgreSQL major lagwatch says it watches (13 to 18), on real servers.

The views carry SQL for each major (views/*.py, by ``server_version_num``); the rest of the
suite starts 15 and 18 only. Here each major in turn gets a primary with a streaming
replica (its own slot, a 50 ms apply delay), a second cluster subscribed to a publication
on that primary (logical replication, every major here has it), pg_walinspect where the
major ships it (16, 17 from the npm packages; 15 Debian's contrib; 18 the wheel's), a lag
oracle writing 200 commits a second, and one `lagwatch run` watching both clusters. What
must hold on each:

- every view of lagwatch's view registry (``views.CYCLE_VIEWS``) and every room's
  (``rooms.VIEWS``: a view or room added later is covered) that applies to the node (its
  role, and what the probe says: WAL archiving on the primary that archives) was read
  without error on that node (``lagwatch_view_up`` 1, ``lagwatch_view_errors_total`` 0):
  the SQL for a major runs against that major, not only parsed;
- the headline (staleness) between the oracle's proven floor and cap: no reading above
  the cap by more than the oracle's own resolution, the median within max(10 ms, 20 %);
  where pg_walinspect is there, readings dated by the WAL;
- the slot's figures, the why-behind cause (``apply_delay``), the subscription seen from
  both sides, and ``lagwatch check`` exiting 0.

Tests/fetch-pg-majors.sh (run by tests/setup-machine.sh) puts 13, 14, 16 and 17 where
lagwatch.demo.binaries finds them. A missing major is an error, never a skip: a run that
tested five majors must not pass as a run that tested six. ``LAGWATCH_TEST_PG_MAJORS``
narrows the list for a local run, as it does for the rest of the suite.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from chaoscluster import ChaosCluster
from harness import Lagwatch, Readings, cluster_config, run_cli
from lagwatch import rooms
from lagwatch.demo.binaries import find_binaries
from lagwatch.demo.cluster import LocalCluster
from lagwatch.demo.ports import free_port
from lagwatch.demo.servers import wait_until
from lagwatch.views import CYCLE_VIEWS, probe
from oracle import LagOracle, nearest_rank, tolerance
from psycopg.rows import dict_row

MATRIX = (13, 14, 15, 16, 17, 18)
APPLY_DELAY = 0.05
PUBLISHED = "lw_versions"
SUBSCRIPTION = "lw_versions_sub"


def _majors() -> list[int]:
    wanted = os.environ.get("LAGWATCH_TEST_PG_MAJORS", "").replace(",", " ").split()
    return [m for m in MATRIX if not wanted or str(m) in wanted]


class Publisher(ChaosCluster):
    """A primary that can publish (wal_level logical), with one streaming replica."""

    def primary_settings(self) -> dict[str, str]:
        return {**super().primary_settings(), "wal_level": "logical"}


@pytest.fixture(scope="module", params=_majors(), ids=lambda m: f"pg{m}")
def servers(request: pytest.FixtureRequest) -> Iterator[tuple[Publisher, LocalCluster]]:
    binaries = find_binaries(request.param)  # raises, naming the script, where a major is missing
    with Publisher(binaries, replicas=1) as publisher, LocalCluster(binaries, replicas=0) as subscriber:
        publisher.replicas[0].set_apply_delay(APPLY_DELAY)
        ddl = f"CREATE TABLE {PUBLISHED} (id bigint PRIMARY KEY)"
        publisher.primary.execute(ddl)
        subscriber.primary.execute(ddl)
        publisher.primary.execute(f"CREATE PUBLICATION {SUBSCRIPTION} FOR TABLE {PUBLISHED}")
        # Rows to copy and stream, written before the oracle starts: it must be the only
        # session committing on the primary while it runs, or its cap is no cap (oracle.py).
        publisher.primary.execute(f"INSERT INTO {PUBLISHED} SELECT generate_series(1, 10)")
        subscriber.primary.execute(f"CREATE SUBSCRIPTION {SUBSCRIPTION} CONNECTION '{publisher.primary.dsn()}' "
                                   f"PUBLICATION {SUBSCRIPTION}")
        assert wait_until(lambda: subscriber.primary.scalar(f"SELECT count(*) FROM {PUBLISHED}") == 10, 30), \
            "the subscription's initial copy did not arrive"
        yield publisher, subscriber


def config(publisher: Publisher, subscriber: LocalCluster) -> dict[str, Any]:
    out = cluster_config(publisher, free_port(["127.0.0.1"]), interval="100ms", window="10s")
    out["clusters"].append({"name": "subscriber", "primary": {"dsn": subscriber.primary.dsn()}, "replicas": [],
                            "sla": {"min_replicas": 0}})
    return out


def applicable(node: Any, role: str) -> list[str]:
    """The registry's views and the rooms' that apply to this server (its probe's answer, as
    lagwatch asks it) and its role: each has SQL for it (test_views.py holds them to that)."""
    with psycopg.connect(node.dsn(), autocommit=True, row_factory=dict_row) as conn:
        caps = probe.parse(conn.execute(probe.sql(rooms.probe_columns())).fetchall())
    return [v.name for v in (*CYCLE_VIEWS, *rooms.VIEWS) if role in v.roles and v.readable(caps)
            and v.sql_for(caps.version_num) is not None]


def test_every_view_reads_and_the_headline_holds(servers: tuple[Publisher, LocalCluster], tmp_path: Path) -> None:
    publisher, subscriber = servers
    major = publisher.binaries.major
    replica = publisher.replicas[0]
    walinspect = bool(publisher.primary.scalar(
        "SELECT count(*) FROM pg_extension WHERE extname = 'pg_walinspect'"))
    cfg = config(publisher, subscriber)
    (tmp_path / "lw").mkdir()
    with Lagwatch(tmp_path / "lw", cfg) as lw, \
            LagOracle(publisher, tmp_path / "oracle", max_seconds=60) as oracle, Readings(lw) as readings:
        lw.wait_ready()
        started = lw.cycles()
        # 50 cycles of 100 ms: every view read several times (the one-in-ten views: startup
        # I/O, slot sync, horizon, subscriptions), and some 50 readings under the oracle's writes.
        lw.wait_cycles(50)
        log = oracle.read()
        samples = lw.samples()
        status = lw.status()
        ended = lw.cycles()

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, frozenset(labels.items())))

    # Every view that applies, read on every node without error.
    nodes = [("main", "primary", publisher.primary, "primary"), ("main", replica.name, replica, "replica"),
             ("subscriber", "primary", subscriber.primary, "primary")]
    unread = []
    for cluster, name, node, role in nodes:
        for view in applicable(node, role):
            up = value("lagwatch_view_up", cluster=cluster, node=name, view=view)
            errors = value("lagwatch_view_errors_total", cluster=cluster, node=name, view=view) or 0
            if up != 1 or errors:
                unread.append(f"{cluster}/{name} {view}: up={up} errors={errors}")
    assert not unread, f"pg{major}: views not read:\n" + "\n".join(unread) + "\n" + lw.log_tail(30)
    assert ended - started >= 50

    # The headline against the oracle, judged as the field test judges each replica
    # (test_lag_field.py): the median and p95 within max(10 ms, 20 %) of the oracle's over
    # the same instants, and readings above its cap by more than max(5 ms, 10 %) (the
    # probe's resolution: it polls every ~2 ms, each answer true inside its round trip) at
    # most 1 % of them, rounded up: one of a cell's ~50. (The clock that dates a reading is
    # the same on every major and held to more by test_lag_truth and test_lag_field; what
    # differs by major here is what the views read.)
    seen = [r for r in readings.of(replica.name) if log.covers(replica.name, r.at)]
    assert len(seen) >= 30, (major, len(seen))
    truths = [log.truth(replica.name, r.at) for r in seen]
    over = [f"{r.at:.3f}: read {r.seconds * 1000:.1f} ms, truth {t.low * 1000:.1f}..{t.high * 1000:.1f} ms "
            f"({r.evidence})" for r, t in zip(seen, truths, strict=True)
            if r.seconds > t.high + tolerance(t.high, 0.005, 0.10)]
    assert len(over) <= math.ceil(0.01 * len(seen)), f"pg{major} over-read:\n" + "\n".join(over)
    for q in (0.5, 0.95):
        read = nearest_rank([r.seconds for r in seen], q)
        low, high = nearest_rank([t.low for t in truths], q), nearest_rank([t.high for t in truths], q)
        assert low - tolerance(low, 0.010, 0.20) <= read <= high + tolerance(high, 0.010, 0.20), (
            major, q, read, low, high)
    median = statistics.median(r.seconds for r in seen)
    low, high = statistics.median(t.low for t in truths), statistics.median(t.high for t in truths)
    evidence = {r.evidence for r in seen}
    views = sum(len(applicable(node, role)) for *_, node, role in nodes)
    print(f"pg{major}: {len(seen)} readings, {len(over)} over, median {median * 1000:.1f} ms vs oracle "
          f"{low * 1000:.1f}..{high * 1000:.1f} ms, evidence {sorted(evidence)}, {views} node-views read")
    # pg_walinspect is 15+, and every 15+ server here ships it: the cluster creates it.
    assert walinspect == (major >= 15), (major, walinspect)
    assert ("wal_commit" in evidence) == walinspect, (major, evidence)

    # The slot, why it is behind, the subscription from both sides.
    assert value("lagwatch_slot_active", cluster="main", slot=replica.slot_name) == 1
    assert value("lagwatch_slot_retained_bytes", cluster="main", slot=replica.slot_name) is not None
    main = next(c for c in status["clusters"] if c["name"] == "main")
    why = next(r for r in main["replicas"] if r["name"] == replica.name)["why"]
    assert why is not None and why["cause"] == "apply_delay", (major, why)
    assert value("lagwatch_logical_consumer_active", cluster="main", consumer=SUBSCRIPTION,
                 slot=SUBSCRIPTION) == 1
    assert value("lagwatch_logical_staleness_seconds", cluster="main", consumer=SUBSCRIPTION,
                 slot=SUBSCRIPTION) is not None
    assert value("lagwatch_subscription_enabled", cluster="subscriber", subscription=SUBSCRIPTION) == 1
    assert value("lagwatch_subscription_worker_running", cluster="subscriber", subscription=SUBSCRIPTION) == 1

    # The one-shot check, on the same config.
    path = tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    done = run_cli("check", "-c", str(path))
    assert done.returncode == 0, (major, done.stdout[-2000:], done.stderr[-2000:])
