"""Who holds the primary's vacuum horizon, on real servers: a replica's hot_standby_feedback
with a long transaction on it holds the horizon through its slot; the held transactions
match the slot's own age(xmin) on the primary, the holder is named, the shipped alert fires
on a real Prometheus, and it falls once the transaction ends. The primary's own open
transaction shows beside it as "sessions". What is read does not depend on the version
(the columns 17 and 18 add are parsed in the unit tests): one version runs it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from chaoscluster import ChaosCluster
from harness import ROOT, Lagwatch, cluster_config
from lagwatch.demo.ports import free_port
from prom_stack import Prometheus, rules_with_shorter_for

pytestmark = pytest.mark.one_pg_version

RULES = ROOT / "alerts" / "lagwatch.rules.yml"
ALERT_XIDS = 500


@pytest.fixture
def lagwatch(pg_cluster: ChaosCluster, tmp_path: Path) -> Iterator[Lagwatch]:
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]), interval="200ms", window="10s",
                            state_dir=str(tmp_path / "state"))
    config["clusters"][0]["horizon_alert_xids"] = ALERT_XIDS
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        yield lw


def burn(dsn: str, count: int) -> None:
    """``count`` transactions on the primary, each given a transaction id."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(count):
            conn.execute("SELECT txid_current()")


def held_seconds(lw: Lagwatch, holder: str) -> float | None:
    """How long ``holder`` has held the horizon, as lagwatch's latest snapshot says."""
    held: float | None = lw.status()["clusters"][0]["horizon"]["held_seconds"].get(holder)
    return held


def test_a_replicas_feedback_holds_the_horizon_through_its_slot(pg_cluster: ChaosCluster, lagwatch: Lagwatch,
                                                               tmp_path: Path) -> None:
    lw, primary, r1 = lagwatch, pg_cluster.primary, pg_cluster.replicas[0]
    r1.alter_system("hot_standby_feedback", "on")
    r1.alter_system("wal_receiver_status_interval", "1s")  # feedback each second, not each ten
    r1.reload()
    slot = r1.slot_name
    holder = f"slot/{slot}"

    def truth() -> int:
        return int(primary.scalar("SELECT coalesce(age(xmin), 0) FROM pg_replication_slots WHERE slot_name = %s",
                                  (slot,)))

    prometheus = Prometheus([f"127.0.0.1:{lw.port}"], [rules_with_shorter_for(RULES, tmp_path, 300, floor=2.0)])
    prometheus.start()
    with contextlib.ExitStack() as stack, psycopg.connect(r1.dsn()) as reader:
        stack.callback(prometheus.stop)
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM pg_class")  # a snapshot the feedback keeps the primary to
        snapshot_at = time.monotonic()
        lw.wait_for("the replica's feedback on its slot", lambda: primary.scalar(
            "SELECT xmin IS NOT NULL FROM pg_replication_slots WHERE slot_name = %s", (slot,)), 15)
        burn(primary.dsn(), 1)  # an ID at or past the one the slot holds: the clock passes it
        # Dated by the first poll that saw the clock past it, and read as more than 0 from the
        # poll after: by now lagwatch has dated it.
        lw.wait_for("lagwatch dating the held ID", lambda: (held_seconds(lw, holder) or 0) > 0, 15)
        dated_by = time.monotonic()
        burn(primary.dsn(), 2 * ALERT_XIDS - 1)
        held = truth()
        assert held >= 2 * ALERT_XIDS, held
        # Read every poll from the slots: lagwatch's reading is the slot's own age.
        lw.expect("lagwatch_horizon_held_xids", held, timeout=5, holder=holder)
        assert lw.value("lagwatch_horizon_alert_xids") == ALERT_XIDS
        status = lw.status()["clusters"][0]
        assert status["horizon"]["held_xids"][holder] == held, status["horizon"]
        assert next(s for s in status["slots"] if s["name"] == slot)["xmin_age"] == held

        def firing() -> bool:
            return any(a["labels"]["alertname"] == "LagwatchReplicationHoldsHorizon" and a["state"] == "firing"
                       and a["labels"].get("holder") == holder for a in prometheus.alerts())

        lw.wait_for("LagwatchReplicationHoldsHorizon firing on Prometheus", firing, 30)
        # In time: held since lagwatch's transaction ID clock was first seen past the ID the
        # slot holds. That poll read the clock after it passed the ID, which was after the
        # snapshot was taken (an idle primary hands out no IDs: the first after it is the
        # burn's), and lagwatch had dated it by ``dated_by``. The reading is as of a poll
        # answered no later than it was read (``after``), and no earlier than ``before``:
        # three answers on (each answer changes it; they come one at a time on the
        # primary's connection, and one at most is in hand unpublished at any moment).
        # Every bound is an instant the oracle saw or lagwatch published: no tolerance (CI
        # once read 9.200 s where the wall-clock bound of three polls was 9.2025 s).
        assert lw.value("lagwatch_horizon_held_seconds", holder=holder) is not None
        before = time.monotonic()
        seen = [held_seconds(lw, holder)]
        lw.wait_for("three more primary answers", lambda: seen.append(held_seconds(lw, holder)) or len(
            {v for v in seen if v is not None} - {seen[0]}) >= 3, 20)
        held_for = seen[-1]
        after = time.monotonic()
        print(f"horizon held {held_for} s: at least {before - dated_by:.3f}, at most {after - snapshot_at:.3f}")
        assert held_for is not None and before - dated_by <= held_for <= after - snapshot_at, (
            held_for, before - dated_by, after - snapshot_at)

        # The primary's own open transaction shows as "sessions" (read one poll in ten).
        with psycopg.connect(primary.dsn()) as writer:
            writer.execute("SELECT txid_current()")  # its transaction id, kept open
            burn(primary.dsn(), 100)
            lw.wait_for("the primary's own session among the holders", lambda: (lw.value(
                "lagwatch_horizon_held_xids", holder="sessions") or 0) >= 100, 10)
        reader.execute("COMMIT")  # released: the next feedback moves the slot's xmin on
        burn(primary.dsn(), 10)
        lw.wait_for("the horizon released", lambda: (lw.value("lagwatch_horizon_held_xids", holder=holder)
                                                      or 0) < 100, 15)
