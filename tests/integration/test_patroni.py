"""Patroni discovery against a real Patroni cluster (three members on etcd, REST API over
HTTPS with client certificates) with a real PgBouncer read pool: members found, a
switchover followed, a fourth member joining, a killed leader (failover) followed within
3 intervals of Patroni's own view (or of the promotion itself, if that came later), the
fourth member leaving, a noloadbalance member never pooled, Patroni unreachable with the
members kept.

Discovery does not depend on the PostgreSQL version: one version runs these. The steps
share one cluster and one lagwatch and run in order; each leaves the cluster healthy.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from harness import Lagwatch, let_time_pass, run_cli
from lagwatch.demo.ports import free_port
from patroni_cluster import PatroniCluster, available
from pgbouncer_server import PgBouncerServer, readable_by_servers

pytestmark = pytest.mark.one_pg_version

INTERVAL = 0.5


@pytest.fixture(scope="module")
def patroni() -> Iterator[PatroniCluster]:
    missing = available()
    if missing:
        pytest.fail(missing)  # the suite needs it: a missing piece is an error, not a skip
    # m3 never serves reads and never leads: a failover has one candidate among the first three.
    with PatroniCluster(tags={"m3": {"noloadbalance": True, "nofailover": True}}) as cluster:
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
            "sla": {"max_lag": "2s", "eject_after": 2, "readmit_below": "1s", "readmit_after": 3, "min_replicas": 1},
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


class PoolWatch:
    """Samples the read pool (and whatever else ``also`` reads) every 100 ms in a thread;
    an error in a sample is kept and fails the test, never ends the sampling silently."""

    def __init__(self, pgbouncer: PgBouncerServer, also: Any = None) -> None:
        self.samples: list[tuple[float, set[str], Any]] = []
        self.errors: list[str] = []
        self._pgbouncer, self._also = pgbouncer, also
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                extra = self._also() if self._also else None
                self.samples.append((time.monotonic(), pool_hosts(self._pgbouncer), extra))
            except Exception as exc:  # kept, and asserted on by the test
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(0.1)

    def __enter__(self) -> PoolWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def pools(self) -> list[set[str]]:
        assert not self.errors, self.errors[:5]
        assert self.samples, "the pool was never sampled"
        return [pool for _, pool, _ in self.samples]


def test_members_are_found_and_measured(patroni: PatroniCluster, lagwatch: Lagwatch,
                                        pgbouncer: PgBouncerServer) -> None:
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
                        recovery_conf={"s2": {"recovery_min_apply_delay": f"{int(delay * 1000)}ms"}}) as standby:
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
                # The stream and the delay in force (the standby takes them in its own time),
                # and the readings past the history's start: time, not a state to wait for.
                let_time_pass(3.0)
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


def test_one_shot_commands_ask_patroni(patroni: PatroniCluster, lagwatch: Lagwatch, tmp_path: Path) -> None:
    config = str(lagwatch.config_path)
    validated = run_cli("validate", "-c", config)
    assert validated.returncode == 0 and "1 discovered through Patroni" in validated.stdout, validated
    checked = run_cli("check", "-c", config)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rows = {line.split()[1] for line in checked.stdout.splitlines()[2:] if line.startswith("main ")}
    assert rows == {"m2", "m3"}, checked.stdout  # the replicas Patroni names; m1 leads
    grants = run_cli("check", "--grants", "-c", config)
    # The test connects as postgres: every grant there, and a superuser flagged CRITICAL.
    assert grants.returncode == 2 and "main/m3: CRITICAL more than needed: superuser" in grants.stdout, \
        grants.stdout + grants.stderr
    # Patroni's REST API wants a client certificate: without one, nothing is discovered.
    data = yaml.safe_load(lagwatch.config_path.read_text())
    del data["clusters"][0]["discovery"]["cert_file"], data["clusters"][0]["discovery"]["key_file"]
    no_cert = tmp_path / "no-client-cert.yaml"
    no_cert.write_text(yaml.safe_dump(data))
    refused = run_cli("check", "-c", str(no_cert))
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


def leader_and_primaries(patroni: PatroniCluster, lagwatch: Lagwatch) -> tuple[str | None, set[str], set[str]]:
    """Patroni's running leader, the members lagwatch exports as primaries (the writer
    DSN's node, "primary", lands on whichever member leads: not a member) and the members
    whose PostgreSQL accepts writes, read one after the other."""
    members = patroni.cluster_view()["members"]
    leader = next((m["name"] for m in members if m.get("role") == "leader" and m.get("state") == "running"), None)
    samples = lagwatch.samples()
    primaries = {dict(k)["node"] for (name, k), v in samples.items() if name == "lagwatch_node_role"
                 and v == 1 and dict(k).get("role") == "primary" and dict(k)["node"] != "primary"}
    return leader, primaries, writers(patroni)


def assert_followed_within_three_intervals(watch: PoolWatch, patroni: PatroniCluster, lagwatch: Lagwatch, what: str,
                                           old: str, new: str) -> None:
    """lagwatch's first sample naming ``new`` the one primary, and the pool's first without
    it, within 3 intervals of Patroni's first sample naming it the leader, or of the first
    sample in which its PostgreSQL accepts writes if that came later: lagwatch's roles are
    what PostgreSQL says (Patroni takes the leader key first and promotes after; on a busy
    machine CI saw the promotion itself take seconds). Each change happened some time in
    the gap before the sample that first shows it: the later change's gap is the measure's
    resolution."""
    samples = watch.samples

    def first(what: str, predicate: Any) -> tuple[float, float]:
        i = next((i for i, sample in enumerate(samples) if predicate(sample)), None)
        assert i is not None, f"no sample shows {what}: {[extra for _, _, extra in samples[-5:]]}"
        return samples[i][0], samples[i][0] - samples[i - 1][0] if i else 0.0

    patroni_at, patroni_gap = first(f"Patroni naming {new} the leader", lambda s: s[2][0] == new)
    promoted_at, promoted_gap = first(f"{new}'s PostgreSQL accepting writes", lambda s: new in s[2][2])
    start, resolution = max((patroni_at, patroni_gap), (promoted_at, promoted_gap))
    lagwatch_at = next(t for t, _, (_, primaries, _) in samples if primaries == {new})
    pool_at = next(t for t, pool, (_, primaries, _) in samples
                   if primaries == {new} and host_of(patroni, new) not in pool)
    print(f"{what} {old} -> {new}: PostgreSQL promoted {promoted_at - patroni_at:+.2f}s after Patroni named it; "
          f"lagwatch {lagwatch_at - start:+.2f}s, pool {pool_at - start:+.2f}s after the later "
          f"(interval {INTERVAL}s, changes seen to {resolution:.2f}s)")
    late = lagwatch_at - start > 3 * INTERVAL + resolution or pool_at - start > 3 * INTERVAL + resolution
    story = _story(watch, start, lagwatch) if late else ""
    assert lagwatch_at - start <= 3 * INTERVAL + resolution, story
    assert pool_at - start <= 3 * INTERVAL + resolution, story


def _story(watch: PoolWatch, at: float, lagwatch: Lagwatch) -> str:
    """What a late follow-up looked like: the samples around Patroni's change (seconds from
    it) and lagwatch's own lines of the last minute but HTTP requests (a CI run keeps no log)."""
    samples = [f"{t - at:+.2f}s pool={sorted(pool)} leader,primaries,writers={extra}"
               for t, pool, extra in watch.samples if -6 <= t - at <= 8]
    lines = [line for line in lagwatch.log_text().splitlines()[-600:]
             if line[:4].isdigit() and "lagwatch.http" not in line]
    return "\n".join(["samples:", *samples, "lagwatch's log:", *lines[-120:]])


def test_switchover_is_followed_and_the_pool_changes_once(patroni: PatroniCluster, lagwatch: Lagwatch,
                                                          pgbouncer: PgBouncerServer) -> None:
    changes_before = lagwatch.value("lagwatch_cluster_role_changes_total", cluster="main") or 0
    with PoolWatch(pgbouncer, also=lambda: leader_and_primaries(patroni, lagwatch)) as watch:
        patroni.switchover("m2")
        patroni.wait_streaming(60)
        lagwatch.expect("lagwatch_node_role", 1, timeout=15, cluster="main", node="m2", role="primary")
        lagwatch.expect("lagwatch_node_role", 1, timeout=15, cluster="main", node="m1", role="replica")
        # m2 left the pool at once (promoted); m1, a replica again, earns its way back.
        lagwatch.wait_for("pool = m1", lambda: pool_hosts(pgbouncer) == {host_of(patroni, "m1")}, 30)
    seen = watch.pools()
    assert_followed_within_three_intervals(watch, patroni, lagwatch, "switchover", "m1", "m2")
    assert all(seen), "the read pool was empty during the switchover"
    assert all(host_of(patroni, "m3") not in pool for pool in seen)  # noloadbalance: never served reads
    assert lagwatch.value("lagwatch_cluster_primaries", cluster="main") == 1
    assert (lagwatch.value("lagwatch_cluster_role_changes_total", cluster="main") or 0) >= changes_before + 2
    # Nothing flapped: m2 was ejected once, m1 readmitted once (min_replicas kept one in).
    log = lagwatch.log_text()
    assert log.count("replica=m2 action=eject") == 1 and log.count("replica=m1 action=readmit") == 1, log[-3000:]
    assert lagwatch.value("lagwatch_discovery_members", cluster="main") == 3  # a switchover is no membership change
    lagwatch.expect("lagwatch_patroni_member_info", 1, timeout=5, cluster="main", member="m2", role="leader",
                    state="running")


def test_a_member_joins_polling_and_the_pool_without_a_restart(
        patroni: PatroniCluster, lagwatch: Lagwatch, pgbouncer: PgBouncerServer) -> None:
    pid = lagwatch.proc.pid
    before = pool_hosts(pgbouncer)
    joining = patroni.add_member()
    lagwatch.expect("lagwatch_discovery_members", 4, timeout=15, cluster="main")
    lagwatch.wait_logged(f"joined: {joining.name}")
    lagwatch.expect("lagwatch_up", 1, timeout=10, cluster="main", node=joining.name)
    lagwatch.expect("lagwatch_node_role", 1, cluster="main", node=joining.name, role="replica")
    # A newcomer earns its place like a readmitted replica (readmit_after healthy cycles).
    lagwatch.wait_for(f"{joining.name} pooled", lambda: pool_hosts(pgbouncer) == before | {joining.host}, 20)
    assert lagwatch.log_text().count(f"replica={joining.name} action=readmit") == 1
    assert lagwatch.proc.pid == pid and lagwatch.proc.poll() is None  # never restarted


def test_a_killed_leader_is_followed_within_three_intervals_of_patroni(
        patroni: PatroniCluster, lagwatch: Lagwatch, pgbouncer: PgBouncerServer) -> None:
    """Kill -9 the leader (Patroni and its PostgreSQL): Patroni elects another member once
    the leader key expires (ttl 20 s) and promotes its PostgreSQL. Each sample reads
    Patroni's /cluster, lagwatch's /metrics and each member's pg_is_in_recovery() one after
    the other (some tens of milliseconds), so they are compared at the sampling's resolution."""
    old = patroni.leader()
    assert old is not None and len(pool_hosts(pgbouncer)) == 2, pool_hosts(pgbouncer)
    killed = patroni.member(old)
    try:
        with PoolWatch(pgbouncer, also=lambda: leader_and_primaries(patroni, lagwatch)) as watch:
            killed.kill()
            lagwatch.expect("lagwatch_up", 0, timeout=10, cluster="main", node=old)
            lagwatch.wait_for("Patroni's new leader", lambda: patroni.leader() not in (None, old), 60)
            new = patroni.leader()
            assert new is not None
            lagwatch.expect("lagwatch_node_role", 1, timeout=10, cluster="main", node=new, role="primary")
            # The promoted member leaves the pool; the other reader stays; the killed one is out.
            reader = next(m.name for m in patroni.members if m.name not in (old, new, "m3"))
            lagwatch.wait_for("pool = the other reader",
                              lambda: pool_hosts(pgbouncer) == {host_of(patroni, reader)}, 10)
            lagwatch.wait_cycles(3)  # samples after it, for the record
        pools = watch.pools()
        assert all(pools), "the read pool was empty during the failover"
        assert all(killed.host not in pool for _, pool, (leader, _, _) in watch.samples if leader == new)
        assert all(host_of(patroni, "m3") not in pool for pool in pools)  # noloadbalance: never served reads
        assert_followed_within_three_intervals(watch, patroni, lagwatch, "failover", old, new)
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
    log = lagwatch.log_text()
    assert log.count(f"replica={new} action=eject") >= 1 and "Traceback" not in log


def test_a_member_leaves_polling_and_the_pool_without_a_restart(
        patroni: PatroniCluster, lagwatch: Lagwatch, pgbouncer: PgBouncerServer) -> None:
    pid = lagwatch.proc.pid
    leaving = patroni.member("m4")
    if patroni.leader() == leaving.name:  # the failover above may have promoted it
        patroni.switchover("m1")
        patroni.wait_streaming(60)
    lagwatch.wait_for(f"{leaving.name} pooled", lambda: leaving.host in pool_hosts(pgbouncer), 20)
    before = pool_hosts(pgbouncer) - {leaving.host}
    leaving.stop()
    # Patroni lists a stopped member (state "stopped") until its key's ttl (20 s) runs out;
    # meanwhile it reads as down, and leaves the pool as any unreachable replica does.
    lagwatch.wait_for(f"{leaving.name} out of the pool", lambda: pool_hosts(pgbouncer) == before, 20)
    lagwatch.expect("lagwatch_discovery_members", 3, timeout=45, cluster="main")
    lagwatch.wait_logged(f"left: {leaving.name}")
    lagwatch.wait_for(f"{leaving.name}'s series gone", lambda: lagwatch.value(
        "lagwatch_up", cluster="main", node=leaving.name) is None, 10)
    assert pool_hosts(pgbouncer) == before
    assert lagwatch.proc.pid == pid and lagwatch.proc.poll() is None  # never restarted


def test_patroni_unreachable_keeps_the_members_and_the_lag(patroni: PatroniCluster, lagwatch: Lagwatch) -> None:
    errors_before = lagwatch.value("lagwatch_discovery_errors_total", cluster="main") or 0
    for member in patroni.members:
        member.freeze(True)
    try:
        lagwatch.expect("lagwatch_discovery_up", 0, timeout=10, cluster="main")
        lagwatch.wait_cycles(3)  # cycles without Patroni's answers
        assert lagwatch.value("lagwatch_discovery_members", cluster="main") == 3
        assert (lagwatch.value("lagwatch_discovery_errors_total", cluster="main") or 0) > errors_before
        for name in ("m1", "m2", "m3"):  # PostgreSQL goes on and is still measured
            assert lagwatch.value("lagwatch_up", cluster="main", node=name) == 1
        lagwatch.wait_logged("member discovery failed, keeping the last known 3 member(s)")
    finally:
        for member in patroni.members:
            member.freeze(False)
    lagwatch.expect("lagwatch_discovery_up", 1, timeout=10, cluster="main")
    lagwatch.wait_logged("Patroni answers again")
    assert "Traceback" not in lagwatch.log_text()
