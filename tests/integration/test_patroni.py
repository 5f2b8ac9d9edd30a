"""Patroni discovery against a real Patroni cluster (three members on etcd, REST API over
HTTPS with client certificates) with a real PgBouncer read pool: members found, a
switchover and a killed leader (failover) each followed within FOLLOW_CYCLES of
lagwatch's cycles after Patroni's own view (or the promotion itself, if that came later)
and the pool within POOL_CYCLES, a fourth member joining and leaving, a noloadbalance
member never pooled, Patroni unreachable with the members kept.

Discovery does not depend on the PostgreSQL version: one version runs these. The steps
share one cluster and one lagwatch. Each brings the cluster to the state it starts from
(``settle``: which members run, who leads, the pool lagwatch made of them): in the
module's order that is the state the step before left, and costs nothing; in another
(LAGWATCH_TEST_ORDER=reversed) it does what the steps before would have. What a step
counts in lagwatch's log, it counts from its own start.

Where Patroni would make a step wait its ``ttl`` (20 s, its minimum) for a dead member's
keys to run out, the step lets lagwatch watch the dead member first, then expires them
(PatroniCluster.expire: what etcd does when the ttl runs out, now).
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from harness import Lagwatch, run_cli
from lagwatch.demo.ports import free_port
from patroni_cluster import PatroniCluster, available
from pgbouncer_server import PgBouncerServer, readable_by_servers

pytestmark = pytest.mark.one_pg_version

INTERVAL = 0.5
MAX_LAG, EJECT_AFTER, READMIT_AFTER = 2.0, 2, 3  # the SLA (max_lag in seconds)
BASE = ("m1", "m2", "m3")  # the members the cluster starts with
NOT_POOLED = "m3"  # tagged noloadbalance (never in the read pool) and nofailover (never leads)
# How many of lagwatch's cycles may end after a role change before it publishes it: the
# roles are read on the servers in every cycle, so the cycle under way when the change
# came may have read them just before it, and the next one begins after it and reads it.
# Cycles lagwatch was late in (some answers got to too late: the cluster carried over, no
# role change, no pool decision that cycle) are not counted.
FOLLOW_CYCLES = 2
# And before the pool follows: the instance holding the leader lock on the new primary
# changes it; the round trip that takes the lock there begins in the first cycle after
# the promotion (leader.py), and one that answers after that cycle stopped waiting (a
# busy host; lagwatch publishes no sign of it) is taken by the next.
POOL_CYCLES = FOLLOW_CYCLES + 1
# Cycles lagwatch watches a cluster whose leader was killed before the dead leader's keys
# are expired (Patroni would wait out its ttl, 20 s), long enough for every pool rule to
# act in a cluster without a primary: a replica read unknown, unreachable or not streaming
# is ejected after EJECT_AFTER bad cycles; one whose lag grows with the clock (by an
# interval a cycle at least: cycles begin an interval apart at the soonest) is over
# MAX_LAG after MAX_LAG / INTERVAL + 1 cycles and ejected EJECT_AFTER later; and a cycle
# publishes what min_replicas kept.
NO_PRIMARY_CYCLES = int(MAX_LAG / INTERVAL) + 1 + EJECT_AFTER + 1


@pytest.fixture(scope="module")
def patroni() -> Iterator[PatroniCluster]:
    missing = available()
    if missing:
        pytest.fail(missing)  # the suite needs it: a missing piece is an error, not a skip
    # m3 never serves reads and never leads: a failover has one candidate among the first three.
    # m1 is preferred where a failover has two candidates as far along (m1 and m4, m2 killed
    # after the switchover to it): m4 is then a replica when it leaves, with no switchover
    # to make it one.
    with PatroniCluster(tags={"m1": {"failover_priority": 2},
                              "m3": {"noloadbalance": True, "nofailover": True}}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def pgbouncer(patroni: PatroniCluster) -> Iterator[PgBouncerServer]:
    m1 = patroni.member("m1")
    server = PgBouncerServer(primary_dsn_entry=f"host={m1.host} port={m1.pg_port} dbname=postgres")
    server.include_file.write_text(f"app_ro = host={m1.host} port={m1.pg_port} dbname=postgres\n")
    readable_by_servers(server.include_file)
    with server:
        yield server


@pytest.fixture(scope="module")
def lagwatch(patroni: PatroniCluster, pgbouncer: PgBouncerServer,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lagwatch]:
    workdir = tmp_path_factory.mktemp("patroni-lagwatch")
    config: dict[str, Any] = {
        "interval": f"{int(INTERVAL * 1000)}ms", "window": "1m", "listen": f"127.0.0.1:{free_port(['127.0.0.1'])}",
        "state_dir": str(workdir / "state"),
        "clusters": [{
            "name": "main",
            # m2's URL first: when m2 is stopped, the next one answers
            "discovery": {"kind": "patroni", "urls": [patroni.member(n).url for n in ("m2", "m1", "m3")],
                          "timeout": "300ms", "ca_file": str(patroni.tls.ca),
                          "cert_file": str(patroni.tls.client[0]), "key_file": str(patroni.tls.client[1])},
            "members": {"dsn": "user=postgres dbname=postgres"},
            "sla": {"max_lag": f"{MAX_LAG:g}s", "eject_after": EJECT_AFTER, "readmit_below": "1s",
                    "readmit_after": READMIT_AFTER, "min_replicas": 1},
            "pooler": {"kind": "pgbouncer", "admin_dsn": pgbouncer.admin_dsn,
                       "include_file": str(pgbouncer.include_file), "database": "app_ro", "when_empty": "keep",
                       "options": f"port={patroni.members[0].pg_port} dbname=postgres"},
        }],
    }
    with Lagwatch(workdir, config) as lw:
        lw.wait_ready()
        yield lw


def pool_hosts(pgbouncer: PgBouncerServer) -> set[str]:
    with psycopg.connect(pgbouncer.admin_dsn, autocommit=True, connect_timeout=5) as conn:
        for row in conn.execute("SHOW DATABASES").fetchall():
            if row[0] == "app_ro":
                return set(str(row[1]).split(","))
    return set()


def host_of(patroni: PatroniCluster, name: str) -> str:
    return patroni.member(name).host


def running(patroni: PatroniCluster) -> set[str]:
    return {m.name for m in patroni.members if m.proc is not None and m.proc.poll() is None}


def settle_patroni(patroni: PatroniCluster, names: tuple[str, ...], leaders: tuple[str, ...] = ()) -> str:
    """Patroni's side of the state a step starts from: ``names`` run and stream (a missing
    fourth member added, a stopped one started, any other removed), led by one of
    ``leaders`` (the first, if a switchover is needed; any member that may lead if none
    is given). Nothing is done where the cluster is so already. Returns the leader."""
    for name in names:
        if name not in {m.name for m in patroni.members}:
            patroni.add_member(90)
        elif name not in running(patroni):
            patroni.member(name).start()
    patroni.wait_streaming(120, names=set(names))
    allowed = leaders or tuple(n for n in names if n != NOT_POOLED)
    if patroni.leader() not in allowed:
        patroni.switchover(allowed[0])
        patroni.wait_streaming(60, names=set(names))
    for member in [m for m in patroni.members if m.name not in names]:
        patroni.remove_member(member.name)
    leader = patroni.leader()
    assert leader in allowed, patroni.cluster_view()
    return leader


def settle(patroni: PatroniCluster, lagwatch: Lagwatch, pgbouncer: PgBouncerServer, names: tuple[str, ...],
           leaders: tuple[str, ...] = ()) -> str:
    """``settle_patroni``, and lagwatch following it: every member discovered, the leader
    its primary, every other member but NOT_POOLED in the read pool."""
    leader = settle_patroni(patroni, names, leaders)
    lagwatch.expect("lagwatch_discovery_members", len(names), timeout=30, cluster="main")
    lagwatch.expect("lagwatch_node_role", 1, timeout=15, cluster="main", node=leader, role="primary")
    readers = {host_of(patroni, n) for n in names if n not in (leader, NOT_POOLED)}
    lagwatch.wait_for(f"pool = {sorted(readers)}", lambda: pool_hosts(pgbouncer) == readers, 30)
    return leader


class LogSince:
    """lagwatch's log from a step's start: what the step counts in it is its own."""

    def __init__(self, lagwatch: Lagwatch) -> None:
        self._lagwatch, self._start = lagwatch, len(lagwatch.log_text())

    def text(self) -> str:
        return self._lagwatch.log_text()[self._start:]

    def wait_for(self, text: str, timeout: float = 5) -> None:
        self._lagwatch.wait_for(f"{text!r} in the log", lambda: text in self.text(), timeout)


@dataclass(frozen=True)
class Published:
    """One read of lagwatch's /api/status, then of the read pool (PgBouncer's)."""

    start: float  # monotonic, before the reads
    end: float  # after them
    cycles: int
    carried: int  # cycles in a row the cluster was carried over (lagwatch late for some answers)
    late_answers: int  # answers lagwatch got to too late, since it started
    primaries: frozenset[str]  # the members lagwatch observes accepting writes
    pool: frozenset[str]


@dataclass(frozen=True)
class Seen:
    """One read of Patroni's /cluster, then of each member's pg_is_in_recovery()."""

    start: float
    end: float
    leader: str | None  # Patroni's running leader
    writers: frozenset[str]  # the members whose PostgreSQL accepts writes


class Watch:
    """Two threads: one reads what lagwatch publishes and the pool every 50 ms (a cycle is
    500 ms), the other what Patroni and the servers say every 100 ms or so. An error in a
    read is kept and fails the test, never ends the reading silently."""

    def __init__(self, patroni: PatroniCluster, lagwatch: Lagwatch, pgbouncer: PgBouncerServer) -> None:
        self.published: list[Published] = []
        self.seen: list[Seen] = []
        self.errors: list[str] = []
        self._patroni, self._lagwatch, self._pgbouncer = patroni, lagwatch, pgbouncer
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(self._product, 0.05), daemon=True),
                         threading.Thread(target=self._run, args=(self._world, 0.1), daemon=True)]

    def _run(self, read: Callable[[], None], every: float) -> None:
        while not self._stop.is_set():
            try:
                read()
            except Exception as exc:  # kept, and asserted on by the test
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(every)

    def _product(self) -> None:
        start = time.monotonic()
        status = self._lagwatch.status()
        cluster = next(c for c in status["clusters"] if c["name"] == "main")
        primaries = frozenset(n["name"] for n in cluster["nodes"]
                              if n.get("observed_role") == "primary" and n["name"] != "primary")
        pool = frozenset(pool_hosts(self._pgbouncer))
        self.published.append(Published(start, time.monotonic(), int(status["cycles_total"]),
                                         int(cluster.get("carried_cycles") or 0), int(status["late_answers_total"]),
                                         primaries, pool))

    def _world(self) -> None:
        start = time.monotonic()
        members = self._patroni.cluster_view()["members"]
        leader = next((m["name"] for m in members if m.get("role") == "leader" and m.get("state") == "running"), None)
        accepting = frozenset(writers(self._patroni))
        self.seen.append(Seen(start, time.monotonic(), leader, accepting))

    def __enter__(self) -> Watch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def pools(self) -> list[frozenset[str]]:
        assert not self.errors, self.errors[:5]
        assert self.published, "the pool was never sampled"
        return [p.pool for p in self.published]


def test_members_are_found_and_measured(patroni: PatroniCluster, lagwatch: Lagwatch,
                                        pgbouncer: PgBouncerServer) -> None:
    settle_patroni(patroni, BASE, leaders=("m1",))
    lagwatch.expect("lagwatch_discovery_up", 1, timeout=15, cluster="main")
    lagwatch.expect("lagwatch_discovery_members", 3, cluster="main")
    lagwatch.expect("lagwatch_node_role", 1, timeout=10, cluster="main", node="m1", role="primary")
    for name in ("m2", "m3"):
        lagwatch.expect("lagwatch_node_role", 1, cluster="main", node=name, role="replica")
        lagwatch.wait_for(f"{name} measured", lambda n=name: lagwatch.value(  # type: ignore[misc]
            "lagwatch_replica_lag_seconds", cluster="main", replica=n) is not None, 10)
    lagwatch.expect("lagwatch_cluster_primaries", 1, cluster="main")
    # Patroni's own word on roles, beside what lagwatch observes
    lagwatch.expect("lagwatch_patroni_member_info", 1, cluster="main", member="m1", role="leader", state="running")
    lagwatch.expect("lagwatch_patroni_member_info", 1, cluster="main", member="m3", role="replica", state="streaming")
    assert "members from" in lagwatch.log_text()
    # The read pool: m2 only; m1 is the primary, m3 is tagged noloadbalance.
    lagwatch.wait_for("pool = m2", lambda: pool_hosts(pgbouncer) == {host_of(patroni, "m2")}, 15)
    assert lagwatch.value("lagwatch_pool_member", cluster="main", replica="m3") == 0


class _Commits:
    """A row committed on ``dsn`` every 50 ms in a thread, for as long as the block runs."""

    def __init__(self, dsn: str) -> None:
        self._dsn, self._stop = dsn, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS standby_ticks (at timestamptz)")
            while not self._stop.wait(0.05):
                conn.execute("INSERT INTO standby_ticks VALUES (clock_timestamp())")

    def __enter__(self) -> _Commits:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_a_standby_cluster_is_watched_through_its_standby_leader(
        patroni: PatroniCluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A Patroni standby cluster of the test cluster (s1 its standby leader, streaming from
    m1; s2 cascading from s1 and applying 500 ms late, set through Patroni), discovered from
    its REST API: s1 is the standby leader, the cluster has no writer and nothing says "no
    primary", and s2's staleness against what s1 has reads its apply delay under a steady
    stream of commits (within 20 %, as the lag truth tests hold), s1's reads near 0.
    (Patroni resumes a paused replay by itself: the delay is the lag made here.)"""
    leader = patroni.member(patroni.leader() or "m1")
    workdir = tmp_path_factory.mktemp("standby-lagwatch")
    delay = 0.5
    with PatroniCluster(standby_of=(leader.host, leader.pg_port), hosts=["127.0.0.25", "127.0.0.26"], size=2,
                        recovery_conf={"s2": {"recovery_min_apply_delay": f"{int(delay * 1000)}ms"}},
                        etcd_of=patroni) as standby:
        config: dict[str, Any] = {
            "interval": f"{int(INTERVAL * 1000)}ms", "window": "1m",
            "listen": f"127.0.0.1:{free_port(['127.0.0.1'])}", "state_dir": str(workdir / "state"),
            "clusters": [{"name": "dr", "members": {"dsn": "user=postgres dbname=postgres"},
                          "discovery": {"kind": "patroni", "urls": [m.url for m in standby.members],
                                        "timeout": "300ms", "ca_file": str(standby.tls.ca),
                                        "cert_file": str(standby.tls.client[0]),
                                        "key_file": str(standby.tls.client[1])}}]}
        with Lagwatch(workdir, config) as lw:
            lw.wait_ready()
            lw.expect("lagwatch_node_role", 1, timeout=15, cluster="dr", node="s1", role="standby_leader")
            lw.expect("lagwatch_node_role", 1, cluster="dr", node="s2", role="replica")
            assert lw.value("lagwatch_cluster_primaries", cluster="dr") == 0
            with _Commits(leader.dsn()):
                # The stream of commits past s2's apply delay before the first reading: cycles
                # begin an interval apart at the soonest, so 4 of them end at least 3
                # intervals (1.5 s, three times the delay) after the commits began, and the
                # readings of s2 are of commits it applied late, not of the quiet before.
                lw.wait_cycles(4)
                readings: dict[str, list[float]] = {"s1": [], "s2": []}
                for _ in range(12):
                    for name, values in readings.items():
                        value = lw.value("lagwatch_replica_lag_seconds", cluster="dr", replica=name)
                        assert value is not None, name
                        values.append(value)
                    lw.wait_cycles(1)
            s2, s1 = statistics.median(readings["s2"]), statistics.median(readings["s1"])
            print(f"standby cluster: s2 (apply delay {delay * 1000:.0f} ms) reads {s2 * 1000:.0f} ms, "
                  f"s1 (standby leader) {s1 * 1000:.0f} ms")
            assert abs(s2 - delay) <= 0.2 * delay, readings["s2"]
            assert s1 <= 0.05, readings["s1"]
            status = lw.status()["clusters"][0]
            assert [a["alert"] for a in status["alert_conditions"]] == [], status["alert_conditions"]
            assert "no node accepts writes" not in lw.log_text()


def test_one_shot_commands_ask_patroni(patroni: PatroniCluster, lagwatch: Lagwatch, pgbouncer: PgBouncerServer,
                                       tmp_path: Path) -> None:
    settle(patroni, lagwatch, pgbouncer, BASE, leaders=("m1",))
    config = str(lagwatch.config_path)
    # Patroni's REST API wants a client certificate: without one, nothing is discovered.
    data = yaml.safe_load(lagwatch.config_path.read_text())
    del data["clusters"][0]["discovery"]["cert_file"], data["clusters"][0]["discovery"]["key_file"]
    no_cert = tmp_path / "no-client-cert.yaml"
    no_cert.write_text(yaml.safe_dump(data))
    # Four commands, each its own process and its own questions to Patroni: run side by side.
    with ThreadPoolExecutor(4) as pool:
        validated, checked, grants, refused = pool.map(lambda args: run_cli(*args), [
            ("validate", "-c", config), ("check", "-c", config), ("check", "--grants", "-c", config),
            ("check", "-c", str(no_cert))])
    assert validated.returncode == 0 and "1 discovered through Patroni" in validated.stdout, validated
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rows = {line.split()[1] for line in checked.stdout.splitlines()[2:] if line.startswith("main ")}
    assert rows == {"m2", "m3"}, checked.stdout  # the replicas Patroni names; m1 leads
    # The test connects as postgres: every grant there, and a superuser flagged CRITICAL.
    assert grants.returncode == 2 and "main/m3: CRITICAL more than needed: superuser" in grants.stdout, \
        grants.stdout + grants.stderr
    assert refused.returncode == 3, refused.stdout + refused.stderr  # UNKNOWN
    assert "main: member discovery failed" in refused.stdout, refused.stdout


def writers(patroni: PatroniCluster) -> set[str]:
    """The members whose own PostgreSQL accepts writes now, asked directly (the test's
    oracle for a promotion: Patroni names a leader when it takes the leader key and
    promotes its PostgreSQL afterwards, asynchronously)."""
    out = set()
    for member in patroni.members:
        try:
            with psycopg.connect(member.dsn(), autocommit=True, connect_timeout=1) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        except psycopg.Error:
            continue  # down or starting: not a writer
        if row is not None and row[0] is False:
            out.add(member.name)
    return out


def assert_followed(watch: Watch, patroni: PatroniCluster, lagwatch: Lagwatch, what: str, old: str,
                    new: str) -> None:
    """lagwatch published ``new`` as the one primary within FOLLOW_CYCLES of its own cycles
    (those it was on time for), and the pool without it within POOL_CYCLES, after Patroni
    named ``new`` the leader, or after its PostgreSQL accepted writes if that came later:
    lagwatch's roles are what PostgreSQL says (Patroni takes the leader key first and
    promotes after; on a busy machine CI saw the promotion itself take seconds).

    Counted in cycles, bounded by what the reads could tell: the change came after the
    start of the last read of the world that did not show it, and by the end of the first
    that did; the cycles lagwatch had published by then are at most those read from it
    right after that end. lagwatch published ``new`` in a cycle after the one its last
    read without ``new`` showed. Each bound gives the benefit of the doubt to lagwatch by
    the reads' resolution (a cycle at most, as they read 2-10 times a cycle): the
    bounds are printed."""
    assert not watch.errors, watch.errors[:5]
    seen, published = watch.seen, watch.published

    def first(what: str, predicate: Callable[[Any], bool], among: list[Any]) -> int:
        i = next((i for i, sample in enumerate(among) if predicate(sample)), None)
        assert i is not None, f"no read shows {what}: {among[-5:]}"
        assert i > 0, f"the first read already shows {what}: {among[0]}"
        return i

    named = first(f"Patroni naming {new} the leader", lambda s: s.leader == new, seen)
    promoted = first(f"{new}'s PostgreSQL accepting writes", lambda s: new in s.writers, seen)
    after = max(seen[named - 1].start, seen[promoted - 1].start)
    by = max(seen[named].end, seen[promoted].end)
    change_before = max((p.cycles for p in published if p.end <= after), default=0)
    change_by = next((p.cycles for p in published if p.start >= by), None)
    assert change_by is not None, "no read of lagwatch after the change"
    new_host = host_of(patroni, new)
    primary = first(f"lagwatch publishing {new} the one primary", lambda p: p.primaries == {new}, published)
    pooled = first(f"the pool without {new} beside it", lambda p: p.primaries == {new} and new_host not in p.pool,
                   published)
    # The cycles lagwatch was late in: those it says it carried over, and every cycle
    # between two reads across which its count of late answers grew (which of them it was,
    # the reads cannot tell).
    carried = {c for p in published for c in range(p.cycles - p.carried + 1, p.cycles + 1)}
    carried |= {c for a, b in itertools.pairwise(published) if b.late_answers > a.late_answers
                for c in range(a.cycles + 1, b.cycles + 1)}

    def on_time_after_change(i: int) -> int:
        """Cycles lagwatch was on time for after the change (at most), up to the cycle that
        published read ``i`` (at the soonest: the one after the read before it)."""
        published_in = published[i - 1].cycles + 1
        return published_in - change_by - len({c for c in carried if change_by < c <= published_in})

    follow, pool = on_time_after_change(primary), on_time_after_change(pooled)
    print(f"{what} {old} -> {new}: PostgreSQL promoted {seen[promoted].end - seen[named].end:+.2f}s after Patroni "
          f"named it; the later after cycle {change_before} and by cycle {change_by}; lagwatch published it in cycle "
          f"{published[primary - 1].cycles + 1}..{published[primary].cycles}, the pool in "
          f"{published[pooled - 1].cycles + 1}..{published[pooled].cycles}: {follow} and {pool} cycles it was on time "
          f"for after the change; late in: {sorted(c for c in carried if c > change_before)}")
    story = _story(watch, by, lagwatch) if follow > FOLLOW_CYCLES or pool > POOL_CYCLES else ""
    assert follow <= FOLLOW_CYCLES, story
    assert pool <= POOL_CYCLES, story


def _story(watch: Watch, at: float, lagwatch: Lagwatch) -> str:
    """What a late follow-up looked like: the reads around the change (seconds from it)
    and lagwatch's own lines of the last minute but HTTP requests (a CI run keeps no log)."""
    reads = sorted([(p.start, f"lagwatch: cycle {p.cycles} (carried {p.carried}, late answers {p.late_answers}) "
                              f"primaries={sorted(p.primaries)} pool={sorted(p.pool)}") for p in watch.published]
                   + [(s.start, f"world: leader={s.leader} writers={sorted(s.writers)}") for s in watch.seen])
    lines = [line for line in lagwatch.log_text().splitlines()[-600:]
             if line[:4].isdigit() and "lagwatch.http" not in line]
    return "\n".join(["reads:", *(f"{t - at:+.2f}s {text}" for t, text in reads if -6 <= t - at <= 8),
                      "lagwatch's log:", *lines[-120:]])


def test_switchover_is_followed_and_the_pool_changes_once(patroni: PatroniCluster, lagwatch: Lagwatch,
                                                          pgbouncer: PgBouncerServer) -> None:
    settle(patroni, lagwatch, pgbouncer, BASE, leaders=("m1",))
    log = LogSince(lagwatch)
    changes_before = lagwatch.value("lagwatch_cluster_role_changes_total", cluster="main") or 0
    with Watch(patroni, lagwatch, pgbouncer) as watch:
        patroni.switchover("m2")
        patroni.wait_streaming(60)
        lagwatch.expect("lagwatch_node_role", 1, timeout=15, cluster="main", node="m2", role="primary")
        lagwatch.expect("lagwatch_node_role", 1, timeout=15, cluster="main", node="m1", role="replica")
        # m2 left the pool at once (promoted); m1, a replica again, earns its way back.
        lagwatch.wait_for("pool = m1", lambda: pool_hosts(pgbouncer) == {host_of(patroni, "m1")}, 30)
    seen = watch.pools()
    assert_followed(watch, patroni, lagwatch, "switchover", "m1", "m2")
    assert all(seen), "the read pool was empty during the switchover"
    assert all(host_of(patroni, NOT_POOLED) not in pool for pool in seen)  # noloadbalance: never served reads
    assert lagwatch.value("lagwatch_cluster_primaries", cluster="main") == 1
    assert (lagwatch.value("lagwatch_cluster_role_changes_total", cluster="main") or 0) >= changes_before + 2
    # Nothing flapped: m2 was ejected once, m1 readmitted once (min_replicas kept one in).
    text = log.text()
    assert text.count("replica=m2 action=eject") == 1 and text.count("replica=m1 action=readmit") == 1, text[-3000:]
    assert lagwatch.value("lagwatch_discovery_members", cluster="main") == 3  # a switchover is no membership change
    lagwatch.expect("lagwatch_patroni_member_info", 1, timeout=5, cluster="main", member="m2", role="leader",
                    state="running")


def test_a_member_joins_polling_and_the_pool_without_a_restart(
        patroni: PatroniCluster, lagwatch: Lagwatch, pgbouncer: PgBouncerServer) -> None:
    settle(patroni, lagwatch, pgbouncer, BASE)
    log = LogSince(lagwatch)
    pid = lagwatch.proc.pid
    before = pool_hosts(pgbouncer)
    joining = patroni.add_member()
    lagwatch.expect("lagwatch_discovery_members", 4, timeout=15, cluster="main")
    log.wait_for(f"joined: {joining.name}")
    lagwatch.expect("lagwatch_up", 1, timeout=10, cluster="main", node=joining.name)
    lagwatch.expect("lagwatch_node_role", 1, cluster="main", node=joining.name, role="replica")
    # A newcomer earns its place like a readmitted replica (readmit_after healthy cycles).
    lagwatch.wait_for(f"{joining.name} pooled", lambda: pool_hosts(pgbouncer) == before | {joining.host}, 20)
    assert log.text().count(f"replica={joining.name} action=readmit") == 1
    assert lagwatch.proc.pid == pid and lagwatch.proc.poll() is None  # never restarted


def test_a_killed_leader_is_followed_within_two_cycles_of_patroni(
        patroni: PatroniCluster, lagwatch: Lagwatch, pgbouncer: PgBouncerServer) -> None:
    """Kill -9 the leader (Patroni and its PostgreSQL): lagwatch reads it down and watches a
    cluster without a primary for NO_PRIMARY_CYCLES; then its keys expire (Patroni would
    wait its ttl, 20 s), Patroni elects another member and promotes its PostgreSQL, and
    lagwatch follows within FOLLOW_CYCLES (assert_followed)."""
    members = (*BASE, "m4")
    old = settle(patroni, lagwatch, pgbouncer, members, leaders=("m2", "m1", "m4"))
    assert len(pool_hosts(pgbouncer)) == 2, pool_hosts(pgbouncer)
    log = LogSince(lagwatch)
    killed = patroni.member(old)
    try:
        with Watch(patroni, lagwatch, pgbouncer) as watch:
            killed.kill()
            lagwatch.expect("lagwatch_up", 0, timeout=10, cluster="main", node=old)
            lagwatch.wait_cycles(NO_PRIMARY_CYCLES)
            patroni.expire(old)  # its keys' ttl, run out now (a no-op if a slow host let it run out already)
            lagwatch.wait_for("Patroni's new leader", lambda: patroni.leader() not in (None, old), 60)
            new = patroni.leader()
            assert new is not None
            lagwatch.expect("lagwatch_node_role", 1, timeout=10, cluster="main", node=new, role="primary")
            # The promoted member leaves the pool; the other reader stays; the killed one is out.
            reader = next(n for n in members if n not in (old, new, NOT_POOLED))
            lagwatch.wait_for("pool = the other reader",
                              lambda: pool_hosts(pgbouncer) == {host_of(patroni, reader)}, 10)
            lagwatch.wait_cycles(3)  # reads after it, for the record
        pools = watch.pools()
        assert all(pools), "the read pool was empty during the failover"
        named = next((s.end for s in watch.seen if s.leader == new), None)
        assert named is not None, f"no read shows Patroni naming {new} the leader"
        assert all(killed.host not in p.pool for p in watch.published if p.start >= named)
        assert all(host_of(patroni, NOT_POOLED) not in pool for pool in pools)  # noloadbalance: never served reads
        assert_followed(watch, patroni, lagwatch, "failover", old, new)
        assert lagwatch.value("lagwatch_cluster_primaries", cluster="main") == 1
        lagwatch.expect("lagwatch_replica_follows_primary", 1, timeout=15, cluster="main", replica=reader)
        # not a lagging replica
        assert lagwatch.value("lagwatch_replica_lag_seconds", cluster="main", replica=new) is None
    except BaseException:
        # The steps after this one need the member back: a failure here must not become theirs.
        killed.start()
        patroni.wait_streaming(120)
        raise

    # The killed leader comes back as a replica of the new one (rewound or cloned) and
    # re-enters the pool once, after readmit_after healthy cycles.
    killed.start()
    patroni.wait_streaming(120)
    lagwatch.expect("lagwatch_node_role", 1, timeout=15, cluster="main", node=old, role="replica")
    lagwatch.wait_for(f"{old} pooled again", lambda: pool_hosts(pgbouncer) == {killed.host, host_of(patroni, reader)},
                      30)
    assert log.text().count(f"replica={new} action=eject") >= 1 and "Traceback" not in lagwatch.log_text()


def test_a_member_leaves_polling_and_the_pool_without_a_restart(
        patroni: PatroniCluster, lagwatch: Lagwatch, pgbouncer: PgBouncerServer) -> None:
    # the failover before may have promoted m4: it leaves as a replica
    settle(patroni, lagwatch, pgbouncer, (*BASE, "m4"), leaders=("m1", "m2"))
    log = LogSince(lagwatch)
    pid = lagwatch.proc.pid
    leaving = patroni.member("m4")
    before = pool_hosts(pgbouncer) - {leaving.host}
    leaving.stop()
    # Patroni lists a stopped member (state "stopped") until its key's ttl (20 s) runs out;
    # meanwhile it reads as down, and leaves the pool as any unreachable replica does.
    lagwatch.wait_for(f"{leaving.name} out of the pool", lambda: pool_hosts(pgbouncer) == before, 20)
    patroni.expire(leaving.name)  # its key's ttl, run out now
    lagwatch.expect("lagwatch_discovery_members", 3, timeout=15, cluster="main")
    log.wait_for(f"left: {leaving.name}")
    lagwatch.wait_for(f"{leaving.name}'s series gone", lambda: lagwatch.value(
        "lagwatch_up", cluster="main", node=leaving.name) is None, 10)
    assert pool_hosts(pgbouncer) == before
    assert lagwatch.proc.pid == pid and lagwatch.proc.poll() is None  # never restarted


def test_patroni_unreachable_keeps_the_members_and_the_lag(patroni: PatroniCluster, lagwatch: Lagwatch,
                                                          pgbouncer: PgBouncerServer) -> None:
    settle(patroni, lagwatch, pgbouncer, BASE)
    log = LogSince(lagwatch)
    errors_before = lagwatch.value("lagwatch_discovery_errors_total", cluster="main") or 0
    for member in patroni.members:
        member.freeze(True)
    try:
        lagwatch.expect("lagwatch_discovery_up", 0, timeout=10, cluster="main")
        lagwatch.wait_cycles(3)  # cycles without Patroni's answers
        assert lagwatch.value("lagwatch_discovery_members", cluster="main") == 3
        assert (lagwatch.value("lagwatch_discovery_errors_total", cluster="main") or 0) > errors_before
        for name in BASE:  # PostgreSQL goes on and is still measured
            assert lagwatch.value("lagwatch_up", cluster="main", node=name) == 1
        log.wait_for("member discovery failed, keeping the last known 3 member(s)")
    finally:
        for member in patroni.members:
            member.freeze(False)
    lagwatch.expect("lagwatch_discovery_up", 1, timeout=10, cluster="main")
    log.wait_for("Patroni answers again")
    assert "Traceback" not in lagwatch.log_text()
