"""What pool control costs per cluster: leadership is one session per primary server (not
one per cluster), and the holds file is read only when it changed. The round trips
themselves run against real servers in tests/integration (test_pool_pgbouncer's two
instances, test_observability_e2e's stranger, test_overload's fleet)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from lagwatch.act.holds import HoldStore
from lagwatch.act.leader import Claim, Leadership, lock_key
from lagwatch.config import NodeConfig
from lagwatch.estimate.snapshot import LockHolder
from lagwatch.read.session import SessionContext


def claims(names: list[str], dsn: str) -> dict[str, Claim]:
    return {n: Claim(NodeConfig(dsn=dsn), lock_key(n)) for n in names}


def test_one_session_per_primary_server_holds_every_clusters_lock() -> None:
    async def scenario() -> None:
        leadership = Leadership(SessionContext(), 1.0, 1.0)
        fleet = [f"c{i:03d}" for i in range(300)]
        await leadership.want({**claims(fleet, "host=10.0.0.1"), **claims(["other"], "host=10.0.0.2")})
        assert len(leadership.sessions) == 2
        assert len(leadership.by_cluster["c000"].keys) == 300
        # A cluster no longer wanted (removed, or in dry run) lets its lock go with its session's next round trip.
        session = leadership.by_cluster["c001"]
        session.held["c001"] = lock_key("c001")
        session.session.conn = SimpleNamespace(closed=False)  # type: ignore[assignment]  # open: the release is queued
        await leadership.want(claims([n for n in fleet if n != "c001"], "host=10.0.0.1"))
        assert session.releases == [lock_key("c001")] and "c001" not in session.held
        assert len(leadership.sessions) == 1  # "other"'s session is closed with its last cluster
        session.session.conn = None
        await leadership.close()

    asyncio.run(scenario())


def test_leadership_changes_are_said_in_one_line_for_many_clusters(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        leadership = Leadership(SessionContext(), 1.0, 1.0)
        await leadership.want(claims([f"c{i:03d}" for i in range(300)], "host=10.0.0.1"))
        session = leadership.by_cluster["c000"]
        session.me = LockHolder(9, "lagwatch-leader", "lagwatch", "", True)
        session.held = dict(session.keys)
        session.known = True
        caplog.set_level(logging.INFO, logger="lagwatch")
        leadership.say_changes()
        leadership.say_changes()  # nothing new: nothing said
        await leadership.close()

    asyncio.run(scenario())
    said = [r.getMessage() for r in caplog.records]
    assert said == ["c000, c001, c002, c003, c004 and 295 more cluster(s): this instance is now the leader "
                    "(applies pool changes)"]


def test_the_holds_file_is_read_only_when_it_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = HoldStore(tmp_path / "holds.json")
    assert store.current() == {}
    store.set("main", "replica1", "out")
    reads: list[Path] = []
    real = Path.read_bytes

    def counted(self: Path) -> bytes:
        reads.append(self)
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", counted)
    for _ in range(100):
        assert store.current() == {"main": {"replica1": "out"}}
    assert len(reads) <= 1
    (tmp_path / "holds.json").write_text(json.dumps({"main": {"replica1": "in"}}))
    assert store.current() == {"main": {"replica1": "in"}}


def test_a_session_kept_through_a_membership_change_reconnects_to_the_new_host_list() -> None:
    """Discovery adds a member while the lock session is open on the leader: the session
    stays (no leadership handed over for nothing), and should it be lost, it reconnects
    with the new list, which may hold the member promoted next (CI's Patroni failover:
    the session kept dialling the old list, whose members all refused writes)."""
    async def scenario() -> None:
        leadership = Leadership(SessionContext(), 1.0, 1.0)
        old = "host=10.0.0.1,10.0.0.2 port=5432,5432 target_session_attrs=read-write"
        new = "host=10.0.0.1,10.0.0.2,10.0.0.4 port=5432,5432,5432 target_session_attrs=read-write"
        await leadership.want(claims(["main"], old))
        session = leadership.by_cluster["main"]
        session.session.conn = SimpleNamespace(closed=False, info=SimpleNamespace(host="10.0.0.2", port=5432))  # type: ignore[assignment]
        await leadership.want(claims(["main"], new))
        assert leadership.by_cluster["main"] is session and session.primary == NodeConfig(dsn=new)
        session.session.conn = None
        await leadership.close()

    asyncio.run(scenario())
