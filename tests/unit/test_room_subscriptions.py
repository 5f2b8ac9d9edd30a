"""The subscriptions' room (rooms/subscriptions.py): the primary's own subscriptions, when
it is a subscriber: parse, the leading primary's kept, families, /api/status, /status.
Pure. On real servers: tests/integration/test_logical.py (a subscriber lagwatch watches)."""

from __future__ import annotations

from lagwatch.config.options import ClusterOptions
from lagwatch.estimate.snapshot import ClusterSnapshot, Snapshot
from lagwatch.render.text import render_text
from lagwatch.rooms import subscriptions
from lagwatch.rooms.base import Cycle
from lagwatch.rooms.subscriptions import Subscription
from lagwatch.serve.export import families
from lagwatch.serve.status import cluster_status
from lagwatch.serve.status_page import render


def test_subscriptions_parse_one_poll_in_ten() -> None:
    assert subscriptions.parse([{"subscriptions": None}]) == ()
    assert subscriptions.VIEW.every == 10  # carried between its reads by the poll (test_cadence.py)
    read = subscriptions.parse([{"subscriptions": [
        {"name": "lw_sub", "enabled": True, "worker": False, "received_lsn": "0/3000000", "latest_end_lsn": None,
         "send_age": 0.5, "receipt_age": 0.4, "latest_end_age": None,
         "stats": {"apply_errors": 3, "sync_errors": 0, "insert_exists": 3, "update_missing": 0}}]}])
    assert read is not None
    (sub,) = read
    assert (sub.name, sub.enabled, sub.worker, sub.received_lsn, sub.apply_errors) == ("lw_sub", True, False,
                                                                                      0x3000000, 3)
    assert sub.conflicts == {"insert_exists": 3, "update_missing": 0}
    for version in (130000, 150000, 160000, 180000):
        sql = subscriptions.VIEW.sql_for(version) or ""
        assert ("pg_stat_subscription_stats" in sql) == (version >= 150000)
        assert ("confl_insert_exists" in sql) == (version >= 180000)


def sub(name: str, **kw: object) -> Subscription:
    fields: dict[str, object] = dict(enabled=True, worker=True, received_lsn=0x3000000, latest_end_lsn=0x2FFFFF0,
                                     send_age=0.5, receipt_age=0.4, latest_end_age=1.5, apply_errors=0, sync_errors=0)
    fields.update(kw)
    return Subscription(name, **fields)


def test_the_leading_primarys_are_the_clusters() -> None:
    keeper, main = subscriptions.ROOM.keeper(), ClusterOptions(name="main")
    mine, old = (sub("lw_sub"),), (sub("stale"),)
    assert keeper.update({"p1": mine, "p0": old}, Cycle(1.0, main, "p1")) == mine
    assert keeper.update({"p1": ()}, Cycle(2.0, main, "p1")) == ()  # read: none
    # The leader answered without them (a standby cluster's leader; a failed read, which
    # lagwatch_view_up says): none that apply, never another node's.
    assert keeper.update({"p0": old}, Cycle(3.0, main, "p1")) == ()
    assert keeper.update({"p0": old}, Cycle(4.0, main, None)) is None  # no leader


def snapshot_with(value: tuple[Subscription, ...] | None) -> Snapshot:
    cluster = ClusterSnapshot(name="sub", primary_lsn=None, wal_rate_bytes_per_second=None, replicas=(),
                              walinspect=None, nodes=(), rooms={} if value is None else {"subscriptions": value})
    return Snapshot(1.0, 0.01, 1, 0, (cluster,), interval=1.0, effective_interval=1.0)


def test_exported_shown_and_said_on_the_status_page() -> None:
    broken = sub("b<x>", worker=False, apply_errors=3, conflicts={"insert_exists": 3}, receipt_age=None,
                 latest_end_age=None)
    value = (sub("lw_sub"), broken)
    text = render_text(families(snapshot_with(value))).decode()
    for line in ('lagwatch_subscription_enabled{cluster="sub",subscription="lw_sub"} 1.0',
                 'lagwatch_subscription_worker_running{cluster="sub",subscription="b<x>"} 0.0',
                 'lagwatch_subscription_last_message_age_seconds{cluster="sub",subscription="lw_sub"} 0.4',
                 'lagwatch_subscription_last_reported_age_seconds{cluster="sub",subscription="lw_sub"} 1.5',
                 'lagwatch_subscription_apply_errors_total{cluster="sub",subscription="b<x>"} 3.0',
                 'lagwatch_subscription_sync_errors_total{cluster="sub",subscription="lw_sub"} 0.0',
                 'lagwatch_subscription_conflicts_total{cluster="sub",subscription="b<x>",type="insert_exists"} 3.0'):
        assert line in text, line
    assert 'lagwatch_subscription_last_message_age_seconds{cluster="sub",subscription="b<x>"}' not in text
    (first, _) = cluster_status(snapshot_with(value).clusters[0])["subscriptions"]
    assert (first["name"], first["received_lsn"], first["latest_end_lsn"]) == ("lw_sub", "0/3000000", "0/2FFFFF0")
    assert cluster_status(snapshot_with(()).clusters[0])["subscriptions"] == []
    assert cluster_status(snapshot_with(None).clusters[0])["subscriptions"] is None
    page = render(snapshot_with(value))
    assert ("subscriptions (this primary subscribes): lw_sub: applying, heard from its publisher 400ms ago; "
            '<span class="bad">b&lt;x&gt;: no apply worker, 3 apply errors</span>') in page, page
    assert "this primary subscribes" not in render(snapshot_with(()))
