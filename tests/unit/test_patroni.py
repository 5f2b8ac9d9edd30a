"""Patroni discovery, pure parts: a /cluster answer read, the cluster config its members
make, the config schema, and a member tagged noloadbalance kept out of the pool."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import psycopg.conninfo
import pytest
from lagwatch.act.policy import PolicyState, PoolRules, ReplicaHealth, decide
from lagwatch.config import ClusterConfig, PatroniClusterConfig, ReplicaSla, parse_config
from lagwatch.errors import ConfigError
from lagwatch.sources import discovery as discovery_module
from lagwatch.sources.discovery import Discovery
from lagwatch.sources.patroni import DiscoveryError, Membership, cluster_config, parse_cluster

# What Patroni 4 answers on GET /cluster (trimmed to the keys lagwatch reads and a few more).
ANSWER: dict[str, Any] = {
    "members": [
        {"name": "pg-b", "role": "replica", "state": "streaming", "api_url": "http://10.0.0.2:8008/patroni",
         "host": "10.0.0.2", "port": 5432, "timeline": 3, "lag": 0, "tags": {"noloadbalance": True}},
        {"name": "pg-a", "role": "leader", "state": "running", "api_url": "http://10.0.0.1:8008/patroni",
         "host": "10.0.0.1", "port": 5432, "timeline": 3},
        {"name": "pg-c", "role": "sync_standby", "state": "streaming", "host": "10.0.0.3", "port": 5433,
         "timeline": 3, "lag": 0, "tags": {"nofailover": "true"}},
    ],
    "scope": "demo",
}

CLUSTER = {
    "name": "main",
    "discovery": {"kind": "patroni", "urls": ["http://10.0.0.1:8008", "http://10.0.0.2:8008"]},
    "members": {"dsn": "user=lagwatch dbname=postgres sslmode=prefer"},
}


def test_answer_is_read_sorted_with_tags() -> None:
    m = parse_cluster(ANSWER, "http://10.0.0.1:8008")
    assert [x.name for x in m.members] == ["pg-a", "pg-b", "pg-c"]
    assert m.leader is not None and m.leader.name == "pg-a"
    assert [(x.noloadbalance, x.nofailover) for x in m.members] == [(False, False), (True, False), (False, True)]
    assert m.members[2].port == 5433 and m.members[0].timeline == 3


@pytest.mark.parametrize(("answer", "match"), [
    ([], "no members list"),
    ({"members": "x"}, "no members list"),
    ({"members": [{"name": "a", "host": "h"}]}, "no usable host and port"),
    ({"members": [{"name": "a", "host": "h", "port": 0}]}, "no usable host and port"),
    ({"members": [{"name": "primary", "host": "h", "port": 1}]}, "no usable name"),
    ({"members": [{"name": "a", "host": "h", "port": 1}, {"name": "a", "host": "i", "port": 1}]}, "twice"),
])
def test_bad_answers_are_refused(answer: Any, match: str) -> None:
    with pytest.raises(DiscoveryError, match=match):
        parse_cluster(answer, "u")


HOSTILE_MEMBERS = [
    ({"name": 'r1\n[pools.evil]\nauth = "trust"', "host": "h", "port": 1}, "no usable name"),
    ({"name": "r1 host=evil", "host": "h", "port": 1}, "no usable name"),
    ({"name": "x" * 64, "host": "h", "port": 1}, "no usable name"),
    ({"name": "-r1", "host": "h", "port": 1}, "no usable name"),
    ({"name": "r1", "host": "h\nevil", "port": 1}, "no usable host and port"),
    ({"name": "r1", "host": "h,evil", "port": 1}, "no usable host and port"),
    ({"name": "r1", "host": "h port=1", "port": 1}, "no usable host and port"),
    ({"name": "r1", "host": "h", "port": True}, "no usable host and port"),
]


@pytest.mark.parametrize(("member", "match"), HOSTILE_MEMBERS)
def test_what_patroni_says_is_checked_before_anything_uses_it(member: dict[str, Any], match: str) -> None:
    """Patroni (and the etcd behind it) is remote input: a member name is what a node name
    may be in the config (letters, digits, '.', '_', '-'; 63 characters at most, as
    application_name), a host a host name or address, else the answer is refused whole.
    (A name holding a newline and a pooler section once reached a command pooler's file.)"""
    with pytest.raises(DiscoveryError, match=match):
        parse_cluster({"members": [member]}, "u")


def test_a_member_role_or_state_that_is_no_word_reads_unknown() -> None:
    m = parse_cluster({"members": [{"name": "a", "host": "10.0.0.1", "port": 5432, "role": "leader\nERROR forged",
                                    "state": "\x1b[31mrunning"},
                                   {"name": "b", "host": "fe80::1", "port": 5432, "role": "sync_standby"}]}, "u")
    assert [(x.role, x.state) for x in m.members] == [("unknown", "unknown"), ("sync_standby", "unknown")]


def test_the_same_rule_names_a_replica_in_the_config() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"clusters": [{"name": "c", "primary": {"dsn": "host=p"},
                                    "replicas": [{"name": "r1\nx", "dsn": "host=r"}]}]})
    assert "a node name is letters, digits, '.', '_' and '-'" in str(refused.value)


def test_members_make_a_cluster_config() -> None:
    config = parse_config({"clusters": [CLUSTER]})
    (patroni,) = config.patroni_clusters
    cluster = cluster_config(patroni, parse_cluster(ANSWER, "u"))
    assert isinstance(cluster, ClusterConfig)
    writer = psycopg.conninfo.conninfo_to_dict(cluster.primary.dsn)
    assert writer["host"] == "10.0.0.1,10.0.0.2,10.0.0.3" and writer["port"] == "5432,5432,5433"
    assert writer["target_session_attrs"] == "read-write" and writer["user"] == "lagwatch"
    assert [(r.name, r.walsender_name, r.read_pool) for r in cluster.replicas] == [
        ("pg-a", "pg-a", True), ("pg-b", "pg-b", False), ("pg-c", "pg-c", True)]
    assert psycopg.conninfo.conninfo_to_dict(cluster.replicas[2].dsn) == {
        "user": "lagwatch", "dbname": "postgres", "sslmode": "prefer", "host": "10.0.0.3", "port": "5433",
        "require_auth": "!password"}  # never the password in clear to a host Patroni names


def test_every_option_a_patroni_cluster_shares_with_a_static_one_carries_over() -> None:
    """Each per-cluster option set away from its default in the Patroni cluster's config is
    in force in the cluster its members make (horizon_alert_xids once was not: ignored for
    every Patroni cluster)."""
    options = {"walinspect": "off", "walinspect_max_bytes": 1024, "lag_from_wal": "off",
               "lag_from_wal_max_bytes": 2048, "horizon_alert_xids": 7_000, "dry_run": True,
               "leader_lock_key": "lagwatch-test-key", "heartbeat": {"interval": "2s"},
               "sla": {"max_lag": "3s"}, "schemas": ["monitoring"]}
    shared = set(PatroniClusterConfig.model_fields) & set(ClusterConfig.model_fields) - {"name"}
    assert shared - {"pooler"} == set(options), "an option both kinds share: set it above too"
    (patroni,) = parse_config({"clusters": [{**CLUSTER, **options}]}).patroni_clusters
    cluster = cluster_config(patroni, parse_cluster(ANSWER, "u"))
    for name in shared:
        assert getattr(cluster, name) == getattr(patroni, name), name
    assert cluster.horizon_alert_xids == 7_000


@pytest.mark.parametrize(("change", "problem"), [
    ({"members": {"dsn": "host=db user=x"}}, "clusters[0].members.dsn: must not set host"),
    ({"discovery": {"kind": "patroni", "urls": []}}, "clusters[0].discovery.urls"),
    ({"discovery": {"kind": "patroni", "urls": ["ftp://x:8008"]}}, "not an http:// or https:// URL"),
    ({"discovery": {"kind": "patroni", "urls": ["http://u:p@x:8008"]}}, "not an http:// or https:// URL"),
    ({"discovery": {"kind": "patroni", "urls": ["http://x:8008"], "username": "u"}}, "go together"),
    ({"discovery": {"kind": "patroni", "urls": ["http://x:8008"], "ca_file": "/nonexistent"}}, "cannot be read"),
    ({"discovery": {"kind": "consul", "urls": ["http://x:8008"]}}, "clusters[0].discovery.kind"),
    ({"primary": {"dsn": "host=x"}}, "clusters[0].primary: unknown key"),
    ({"pooler": {"kind": "pgbouncer", "admin_dsn": "host=x", "include_file": "/tmp/x", "database": "ro",
                 "when_empty": "primary"}},
     "with discovery only 'keep' is supported"),
])
def test_schema_names_each_problem_with_its_path(change: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"clusters": [{**CLUSTER, **change}]})
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_static_and_discovered_clusters_mix() -> None:
    static = {"name": "static", "primary": {"dsn": "host=p"}, "replicas": [{"name": "r1", "dsn": "host=r"}]}
    config = parse_config({"clusters": [static, CLUSTER]})
    assert [c.name for c in config.clusters_with_nodes] == ["static"]
    assert [c.name for c in config.patroni_clusters] == ["main"]
    assert isinstance(config.patroni_clusters[0], PatroniClusterConfig)


def test_discovery_keeps_the_last_members_when_patroni_stops_answering(monkeypatch: pytest.MonkeyPatch) -> None:
    (cluster,) = parse_config({"clusters": [CLUSTER]}).patroni_clusters
    answers: list[Any] = [ANSWER, ANSWER, DiscoveryError("http://10.0.0.1:8008/cluster: timed out"),
                          {"members": ANSWER["members"][:2]}]

    def fetch(config: Any, timeout: float) -> Membership:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return parse_cluster(json.loads(json.dumps(answer)), config.urls[0])

    monkeypatch.setattr(discovery_module, "fetch_membership", fetch)
    d = Discovery()
    assert asyncio.run(d.refresh([cluster], 1.0)) is True  # first members: a change
    first = d.cluster_configs([cluster])
    assert asyncio.run(d.refresh([cluster], 1.0)) is False  # the same members: nothing to rebuild
    assert d.cluster_configs([cluster])[0] is first[0]
    assert asyncio.run(d.refresh([cluster], 1.0)) is False  # unanswered: the last members stay
    (status,) = d.statuses([cluster])
    assert (status.up, status.members, status.errors_total) == (False, 3, 1)
    assert "timed out" in (status.error or "")
    assert d.cluster_configs([cluster]) == first
    assert asyncio.run(d.refresh([cluster], 1.0)) is True  # pg-c left
    assert [r.name for r in d.cluster_configs([cluster])[0].replicas] == ["pg-a", "pg-b"]
    assert d.statuses([cluster])[0].up


def test_a_member_never_in_the_read_pool_stays_out_even_for_min_replicas() -> None:
    sla = ReplicaSla(max_lag=2.0, p95=None, eject_after=2, readmit_below=1.0, readmit_after=3)
    state = PolicyState.from_pool(frozenset({"a", "b"}), ("a", "b"), now=0.0)
    decision = decide([ReplicaHealth("a", 0.0, True, True), ReplicaHealth("b", 0.0, True, True)],
                      {"a": sla, "b": sla}, PoolRules(2, False), state, {"b": "in"}, now=1.0, never=["b"])
    assert decision.pool == {"a"}
    assert "noloadbalance" in decision.reasons["b"]
    assert [(c.member, c.action) for c in decision.changes] == [("b", "eject")]


def test_example_discovery_config_in_the_docs_validates(tmp_path: Path) -> None:
    page = (Path(__file__).parents[2] / "docs" / "roles-and-failover.md").read_text()
    start = page.index("```yaml\n# patroni discovery")
    text = page[start + len("```yaml\n"):page.index("```", start + 8)]
    (tmp_path / "c.yaml").write_text(text)
    from lagwatch.config import load_config

    config = load_config(tmp_path / "c.yaml")
    assert config.patroni_clusters


def test_a_standby_cluster_is_reached_through_its_standby_leader() -> None:
    """Patroni's standby cluster: no leader, a standby_leader streaming from outside. The
    writer DSN is the standby leader's address (no target_session_attrs=read-write, which
    no member would ever accept), and another standby leader is a new membership."""
    answer = {"members": [
        {"name": "dr-a", "role": "standby_leader", "state": "streaming", "host": "10.1.0.1", "port": 5432},
        {"name": "dr-b", "role": "replica", "state": "streaming", "host": "10.1.0.2", "port": 5432}]}
    cluster = PatroniClusterConfig.model_validate(CLUSTER)
    membership = parse_cluster(answer, "u")
    config = cluster_config(cluster, membership)
    assert config.standby_cluster
    assert psycopg.conninfo.conninfo_to_dict(config.primary.dsn) == {
        "host": "10.1.0.1", "port": "5432", "user": "lagwatch", "dbname": "postgres", "sslmode": "prefer",
        "require_auth": "!password"}
    moved = parse_cluster({"members": [{**answer["members"][0], "role": "replica"},
                                       {**answer["members"][1], "role": "standby_leader"}]}, "u")
    assert moved.addresses != membership.addresses
    assert not cluster_config(cluster, parse_cluster(ANSWER, "u")).standby_cluster


def test_members_past_the_daemons_max_nodes_are_refused_and_the_last_good_ones_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clusters = parse_config({"clusters": [{**CLUSTER, "name": name, "discovery": {
        "kind": "patroni", "urls": [f"http://{name}:8008"]}} for name in ("a", "b")]}).patroni_clusters
    sizes = {"http://a:8008": 3, "http://b:8008": 3}

    def fetch(config: Any, timeout: float) -> Membership:
        url = config.urls[0]
        return parse_cluster({"members": [{"name": f"m{i}", "host": f"10.0.0.{i}", "port": 5432}
                                          for i in range(sizes[url])]}, url)

    monkeypatch.setattr(discovery_module, "fetch_membership", fetch)
    d = Discovery()
    assert asyncio.run(d.refresh(clusters, 1.0, room=7)) is True
    assert [s.members for s in d.statuses(clusters)] == [3, 3]
    sizes["http://b:8008"] = 5  # 3 + 5 > 7: b's new answer is refused, its 3 members stay
    assert asyncio.run(d.refresh(clusters, 1.0, room=7)) is False
    a, b = d.statuses(clusters)
    assert (a.up, a.members, b.up, b.members) == (True, 3, False, 3)
    assert b.error == "http://b:8008: 5 members, more than the 4 nodes max_nodes leaves room for: refused"
    sizes["http://b:8008"] = 4
    assert asyncio.run(d.refresh(clusters, 1.0, room=7)) is True
    assert [s.members for s in d.statuses(clusters)] == [3, 4] and d.statuses(clusters)[1].up
