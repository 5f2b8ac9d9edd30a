"""`lagwatch check`'s verdicts by table, and password redaction."""

from __future__ import annotations

import pytest
from lagwatch.check import CRITICAL, OK, UNKNOWN, WARNING, evaluate, measuring_only, render
from lagwatch.config import parse_config
from lagwatch.estimate.snapshot import ClusterSnapshot, NodeHealth, ReplicaState, Snapshot
from lagwatch.estimate.windows import LagHistogram
from lagwatch.grants import dating_arm
from lagwatch.redact import redact_text
from lagwatch.views.probe import Capabilities


def replica(name: str, staleness: float | None, *, up: bool | None = True, streaming: bool | None = True,
            configured: bool = True) -> ReplicaState:
    return ReplicaState(name=name, configured=configured, staleness=staleness, staleness_source="replica",
                        window=None, histogram=LagHistogram().snapshot(), replay_lsn=1, streaming=streaming,
                        node_up=up)


def snapshot(*replicas: ReplicaState, primary_up: bool = True) -> Snapshot:
    nodes = (NodeHealth("primary", "primary", primary_up, 180000, 0.01, 1, {}, None, {}),)
    cluster = ClusterSnapshot("main", 100, None, replicas, None, nodes)
    return Snapshot(0.0, 0.01, 1, 0, (cluster,))


@pytest.mark.parametrize("replicas,primary_up,expected", [
    ((replica("r1", 0.0), replica("r2", 0.5)), True, OK),
    ((replica("r1", 6.0), replica("r2", 0.0)), True, WARNING),
    ((replica("r1", 31.0), replica("r2", 6.0)), True, CRITICAL),
    ((replica("r1", 0.0, up=False),), True, CRITICAL),
    ((replica("r1", 0.0, streaming=False),), True, CRITICAL),
    ((replica("r1", None),), True, UNKNOWN),
    ((replica("r1", 0.0),), False, UNKNOWN),
    ((replica("r1", 0.0, up=False),), False, CRITICAL),  # critical outranks unknown
    ((replica("r1", 6.0), replica("r2", None)), True, UNKNOWN),
    # Seen on the primary only (not in the config): shown, never judged, whatever it reads.
    ((replica("r1", 0.0), replica("seen", None, streaming=False, up=None, configured=False)), True, OK),
    ((replica("r1", 0.0), replica("seen", 60.0, streaming=None, configured=False)), True, OK),
])
def test_check_verdicts(replicas: tuple[ReplicaState, ...], primary_up: bool, expected: int) -> None:
    code, rows, problems = evaluate(snapshot(*replicas, primary_up=primary_up), warning=5.0, critical=30.0)
    assert code == expected
    assert len(rows) == len(replicas)
    assert bool(problems) == (expected != OK)
    assert "REPLICA" in render(rows)


def test_a_cluster_not_read_is_unknown_never_silently_ok() -> None:
    """A cluster with a node still connecting (or an answer not taken in time) is not in
    the snapshot: the check says so and is UNKNOWN, not OK by omission."""
    ok = snapshot(replica("r1", 0.0))
    waiting = Snapshot(0.0, 0.01, 1, 0, ok.clusters, connecting=(("east", "replica2"),))
    code, rows, problems = evaluate(waiting, warning=5.0, critical=30.0, expected=("main", "east", "west"))
    assert code == UNKNOWN and len(rows) == 1
    assert problems == ["east: not read: still connecting to replica2",
                        "west: not read: an answer came too late to count"]


def test_redact_text() -> None:
    """Known secrets replaced; what is shaped like one hidden by escape.secret_shapes."""
    assert redact_text("auth failed for hunter2", ["hunter2", None]) == "auth failed for ***"
    assert "hunter2" not in redact_text("bad dsn host=a password=hunter2 user=x", [])
    assert "hunter2" not in redact_text("invalid URI postgresql://u:hunter2@h/db?x=1", [])
    assert "hunter2" not in redact_text("at host=a password='hunter2 x' junk junk", [])
    assert "hunter2" not in redact_text("postgresql://lagwatch@srv:hunter2@db.example.com:5432/p", [])


def test_check_never_controls_the_pool() -> None:
    """`lagwatch check` beside a running daemon must not take its leader lock nor touch the
    pooler: the Daemon it builds gets the config without poolers."""
    from lagwatch.daemon import Daemon

    config = parse_config({"clusters": [{
        "name": "main", "primary": {"dsn": "host=p"}, "replicas": [{"name": "r1", "dsn": "host=r1"}],
        "pooler": {"kind": "command", "template": "{hosts}", "output_file": "/nonexistent/pool.txt",
                   "reload_command": ["true"]}}]})
    assert config.clusters[0].pooler is not None
    checked = measuring_only(config)
    assert [c.pooler for c in checked.clusters] == [None]
    assert checked.clusters[0].replicas == config.clusters[0].replicas
    assert Daemon(checked).runtime.controllers == {}


def test_the_check_names_the_cause_and_a_bad_row_says_why() -> None:
    from lagwatch.check import _row, render
    from lagwatch.estimate.diagnosis import Diagnosis
    from lagwatch.estimate.windows import LagHistogram

    why = Diagnosis("apply_delay", "recovery_min_apply_delay holds replay 5s behind", (0.0, 0.0, 0.0, 6.0),
                    (0, 0, 0, 10), (("apply_delay", 6.0),))
    r = ReplicaState(name="r1", configured=True, staleness=6.0, staleness_source="replica", window=None,
                     histogram=LagHistogram().snapshot(), replay_lsn=1, streaming=True, node_up=True, diagnosis=why)
    row = _row("main", r, None, warning=1.0, critical=5.0)
    assert row.cause == "apply_delay" and row.note.endswith(": recovery_min_apply_delay holds replay 5s behind")
    table = render([row])
    assert "CAUSE" in table.splitlines()[0] and "apply_delay" in table.splitlines()[1]


def _caps(major: int, *, installed: bool = True, granted: bool = True, replica: bool = False) -> Capabilities:
    return Capabilities(version_num=major * 10000 + 1, in_recovery=replica,
                        has_walinspect=installed, can_walinspect=granted, can_read_all_stats=True,
                        can_walinspect_records=granted)


GRANT_RECORDS = "GRANT EXECUTE ON FUNCTION pg_get_wal_records_info(pg_lsn, pg_lsn) TO lw;"


@pytest.mark.parametrize(("caps", "lag_from_wal", "says"), [
    (_caps(18), "auto", "the WAL (pg_walinspect"),
    (_caps(15, granted=False), "auto", f"commit timestamps (no WAL dating: they read low under load, docs/lag.md); "
                                       f"to date them from the WAL: {GRANT_RECORDS}"),
    (_caps(16, installed=False, granted=False), "auto",
     f"in this database: CREATE EXTENSION pg_walinspect; {GRANT_RECORDS}"),
    (_caps(14, installed=False, granted=False), "auto", "PostgreSQL 14 has no pg_walinspect (15+)"),
    (_caps(18), "off", "lag_from_wal is off in the config"),
    (_caps(18, replica=True), "auto", None),
])
def test_check_grants_names_the_arm_a_primarys_replicas_are_dated_by(caps: Capabilities, lag_from_wal: str,
                                                                    says: str | None) -> None:
    arm = dating_arm(caps, "lw", lag_from_wal)
    assert (arm is None) if says is None else (arm is not None and says in arm), arm
