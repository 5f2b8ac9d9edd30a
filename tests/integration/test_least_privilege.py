"""lagwatch as the role from deploy/sql/ (pg_read_all_stats, EXECUTE on pg_ls_waldir() and
on pg_walinspect's records and statistics, not pg_monitor) exports every metric of issue
1/4 and dates the replicas from the WAL, all but what is documented as needing more
(pg_get_wal_block_info's compression savings); `check --grants` says what a role lacks.

One version, the newest: no grant these tests make or expect differs between the majors
lagwatch watches. pg_read_all_stats, pg_monitor, pg_read_server_files, pg_signal_backend,
pg_execute_server_program, pg_write_server_files and EXECUTE on pg_ls_waldir() are the same
on 13-18 (pg_ls_waldir() is granted to pg_monitor by each), and pg_walinspect's functions
go to pg_read_server_files on each major that ships it (15+). The one grant that depends
on the major, pg_get_wal_block_info for walinspect_blocks (16+, probe.Capabilities), is
judged by pure code held by tests/unit/test_poll_budget.py on both sides of 16, and the
views' SQL for every major runs against that major in test_versions.py. The newest is the
major where every function and predefined role lagwatch can ask for exists
(pg_get_wal_block_info, pg_create_subscription).
"""

from __future__ import annotations

import itertools
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from chaoscluster import ChaosCluster, ChaosServer
from harness import ROOT, Lagwatch, Reading, Readings, Writer, cluster_config, run_cli
from lagwatch.demo.ports import free_port

pytestmark = pytest.mark.newest_pg_version

ROLE_SQL = ROOT / "deploy" / "sql" / "lagwatch-role.sql"
REQUIRED = [
    "lagwatch_replica_lag_seconds", "lagwatch_replica_lag_window_seconds",
    "lagwatch_replica_lag_sampled_seconds_bucket",
    "lagwatch_replica_lag_bytes", "lagwatch_replica_walsender_lag_seconds", "lagwatch_replica_replay_paused",
    "lagwatch_replica_streaming", "lagwatch_replica_receive_replay_bytes",
    "lagwatch_replica_last_replay_timestamp_age_seconds", "lagwatch_slot_retained_bytes", "lagwatch_slot_active",
    "lagwatch_slot_safe_wal_size_bytes", "lagwatch_slot_wal_status", "lagwatch_wal_bytes_total",
    "lagwatch_wal_fpi_total", "lagwatch_wal_records_total", "lagwatch_wal_compression_info",
    "lagwatch_wal_directory_bytes", "lagwatch_up", "lagwatch_poll_duration_seconds", "lagwatch_poll_errors_total",
    "lagwatch_wal_inspected_bytes_total", "lagwatch_wal_inspected_fpi_bytes_total",
    "lagwatch_archive_waiting_segments", "lagwatch_archive_archived_total",  # the primary archives (chaoscluster.py)
]
NEEDS_MORE = ["lagwatch_wal_fpi_saved_bytes_total", "lagwatch_wal_fpi_compressed_bytes_total"]
# What lagwatch does here (read its views, mark one down, say so once) is counted in its
# cycles, not in seconds: a short interval only makes them come sooner.
INTERVAL = "500ms"
# How far behind the paused replica must read at least when its lag is judged: well past
# the bracket of two polls a reading may be off by (the test measures that bracket too).
BEHIND = 2.0


def drop_role(primary: ChaosServer) -> None:
    """The role and its grants (EXECUTE on pg_ls_waldir() would keep DROP ROLE from working)."""
    primary.execute("DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'lagwatch') THEN "
                    "EXECUTE 'DROP OWNED BY lagwatch'; EXECUTE 'DROP ROLE lagwatch'; END IF; END $$")


def config_as_lagwatch(pg_cluster: ChaosCluster) -> dict[str, Any]:
    """The usual test config, every node logged in to as the role ``lagwatch``."""
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]), interval=INTERVAL)
    cluster = config["clusters"][0]
    for node in [cluster["primary"], *cluster["replicas"]]:
        node["dsn"] = node["dsn"].replace("user=postgres", "user=lagwatch")
    return config


def test_monitoring_role_is_enough(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    primary = pg_cluster.primary
    drop_role(primary)
    psql = str(pg_cluster.binaries.tool("psql"))
    subprocess.run([psql, "-X", "-v", "ON_ERROR_STOP=1", "-h", primary.host, "-p", str(primary.port), "-U", "postgres",
                    "-d", "postgres", "-f", str(ROLE_SQL)], check=True, capture_output=True, timeout=60)
    assert primary.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'lagwatch'") == [(False,)]
    # Narrowed: no pg_monitor, so no pg_read_all_settings (primary_conninfo's password).
    assert primary.scalar("SELECT pg_has_role('lagwatch', 'pg_read_all_settings', 'USAGE')") is False
    pg_cluster.wait_replayed()

    config = config_as_lagwatch(pg_cluster)
    try:
        with Lagwatch(tmp_path, config) as lw:
            lw.wait_ready()
            with Writer(pg_cluster), Readings(lw) as readings:
                lw.wait_cycles(3)  # every view read under writes
                # The WAL dating is on with the role as shipped: a replica behind under
                # writes is dated by the WAL (one caught up lacks nothing to date: the WAL is
                # read past a replica only while it lacks a commit).
                pg_cluster.replicas[0].pause_replay()
                lw.wait_for("replica1 dated by the WAL", lambda: any(
                    r.evidence == "wal_commit" and r.seconds > 0 for r in readings.of("replica1")), timeout=30)
                pg_cluster.replicas[0].resume_replay()
            names = {name for name, _ in lw.samples()}
            missing = [m for m in REQUIRED if m not in names]
            assert not missing, missing
            for m in NEEDS_MORE:
                assert m not in names
            for node in ("primary", "replica1", "replica2"):
                assert lw.value("lagwatch_up", node=node) == 1
            lag_bytes = lw.value("lagwatch_replica_lag_bytes", replica="replica1", stage="replay")
            assert lag_bytes is not None  # pg_read_all_stats shows the LSNs
            log = lw.log_text()
            # Only the compression savings (pg_get_wal_block_info: raw pages) are left out, said once.
            assert log.count("not reading walinspect") == 1 and log.count("not reading walinspect_blocks") == 1
            assert "pg_get_wal_block_info(pg_lsn, pg_lsn, boolean) TO lagwatch" in log
            assert "wal_dir" not in log and "wal_receiver" not in log and "wal_dating" not in log
            grants = run_cli("check", "--grants", "-c", str(lw.config_path))
            assert grants.returncode == 0, grants.stdout + grants.stderr
            lines = grants.stdout.splitlines()
            for node in ("primary", "replica1", "replica2"):
                assert f"main/{node}: ok as lagwatch (every view lagwatch reads each cycle)" in lines, lines
            assert "main/primary: replicas dated by the WAL (pg_walinspect: the first commit past each replica's " \
                "position)" in lines, lines
            assert not any("MISSING" in line or "more than needed" in line for line in lines), lines
            # Without the grant, the check names the other arm and the one statement that turns it on.
            primary.execute("REVOKE EXECUTE ON FUNCTION pg_get_wal_records_info(pg_lsn, pg_lsn) FROM lagwatch")
            lines = run_cli("check", "--grants", "-c", str(lw.config_path)).stdout.splitlines()
            assert "main/primary: replicas dated by the LSN clock and commit timestamps (no WAL dating: they read " \
                "low under load, docs/lag.md); to date them from the WAL: GRANT EXECUTE ON FUNCTION " \
                "pg_get_wal_records_info(pg_lsn, pg_lsn) TO lagwatch;" in lines, lines
            # A room's grant (rooms/archiver.py) taken away: the check names it, on the node that archives only.
            primary.execute("REVOKE EXECUTE ON FUNCTION pg_ls_archive_statusdir() FROM lagwatch")
            check = run_cli("check", "--grants", "-c", str(lw.config_path))
            lines = check.stdout.splitlines()
            assert check.returncode == 2, check.stdout + check.stderr
            assert [line for line in lines if "MISSING" in line] == [
                "main/primary: MISSING for archiver: GRANT EXECUTE ON FUNCTION pg_ls_archive_statusdir() TO lagwatch "
                "(without it, not read: the segments waiting to be archived (pg_wal/archive_status))"]
    finally:
        drop_role(primary)


def test_a_view_denied_at_run_time_leaves_the_node_up(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    """Grants taken away while lagwatch runs (pg_ls_waldir(), pg_walinspect): those views
    read 0 in lagwatch_view_up, with one warning naming the grant; the node stays up and
    its lag is still measured. pg_ls_archive_statusdir() taken away costs the archiver its
    waiting segments only."""
    primary = pg_cluster.primary
    drop_role(primary)
    primary.execute("CREATE ROLE lagwatch LOGIN; GRANT pg_monitor, pg_read_server_files TO lagwatch")
    pg_cluster.wait_replayed()
    config = config_as_lagwatch(pg_cluster)
    lw = Lagwatch(tmp_path, config)
    try:
        lw.wait_ready()
        with Writer(pg_cluster) as writer:
            lw.wait_for("every view read", lambda: all(lw.value("lagwatch_view_up", node="primary", view=v) == 1
                                                        for v in ("server", "replication", "slots", "wal_dir",
                                                                  "walinspect")), timeout=15)
            replica1 = pg_cluster.replicas[0]
            with Readings(lw, every=0.05) as readings:
                primary.execute("REVOKE EXECUTE ON FUNCTION pg_ls_waldir() FROM pg_monitor; "
                                "REVOKE EXECUTE ON FUNCTION pg_ls_archive_statusdir() FROM pg_monitor; "
                                "REVOKE pg_read_server_files FROM lagwatch")
                # Meanwhile replica1 falls behind, paused under writes, to show its lag still measured.
                caught_up_to = time.monotonic()
                pg_cluster.wait_replayed()  # replica1 has every change made before caught_up_to
                replica1.pause_replay()
                writer.wait_commits(2)  # the second began after the pause: replica1 lacks it
                lacks_since = time.monotonic()
                # A grant the probe had found, refused (wal_dir's): the next poll probes again,
                # which learns pg_walinspect's too (else its read, every WALINSPECT_EVERY, would).
                lw.wait_for("the denied views down", lambda: lw.value("lagwatch_view_up", node="primary",
                                                                      view="wal_dir") == 0
                            and lw.value("lagwatch_view_up", node="primary", view="walinspect") == 0, timeout=25)
                denied = time.monotonic()
                # Lag is time: nothing to wait on but a reading BEHIND seconds past that commit
                # (and past the moment both views were seen down: measured without them).
                since = max(lacks_since + BEHIND, denied)
                lw.wait_for("a reading of replica1 after", lambda: bool(readings.of("replica1", since)), timeout=20)
                reading = readings.of("replica1", since)[0]
                lag = lw.value("lagwatch_replica_lag_seconds", replica="replica1")
                read_by = time.monotonic()
                bracket = widest_gap(readings.of("replica1", end=reading.at))
            # The truth: the oldest change replica1 lacks was made after caught_up_to and no
            # later than lacks_since. A reading is dated within the two polls of the primary
            # that bracket that change (docs/lag.md: clamped between the bracket's ends), so it
            # may be off by the widest gap between the cycles lagwatch published meanwhile.
            assert reading.at - lacks_since - bracket <= reading.seconds <= reading.at - caught_up_to + bracket, \
                (reading, caught_up_to, lacks_since, bracket)
            # The metric is of a cycle no older than that reading and no newer than read_by.
            assert lag is not None and reading.at - lacks_since - bracket <= lag <= read_by - caught_up_to + bracket, \
                (lag, reading, caught_up_to, lacks_since, read_by, bracket)
        assert lw.value("lagwatch_up", node="primary") == 1
        for view in ("server", "replication", "slots", "wal", "archiver"):
            assert lw.value("lagwatch_view_up", node="primary", view=view) == 1, view
        # The archiver's guarded listing: the waiting segments unknown, its counts still read.
        assert lw.value("lagwatch_archive_waiting_segments", node="primary") is None
        assert lw.value("lagwatch_archive_archived_total", node="primary") is not None
        assert (lw.value("lagwatch_view_errors_total", node="primary", view="wal_dir") or 0) >= 1
        log = lw.log_text()
        # Said once, by the only node that reads it: pg_wal is read on the primary alone.
        assert log.count("cannot read wal_dir") == 1
        assert "wal_dir (" in log and ": needs GRANT EXECUTE ON FUNCTION pg_ls_waldir() TO lagwatch" in log
        assert "asking the server again what this role may read" in log
        # pg_walinspect's denial said once: by its read, or by the probe that came first.
        assert log.count("cannot read walinspect") + log.count("not reading walinspect") == 1, log
        assert "pg_get_wal_stats" in log
    finally:
        lw.stop()
        primary.execute("GRANT EXECUTE ON FUNCTION pg_ls_waldir() TO pg_monitor; "
                        "GRANT EXECUTE ON FUNCTION pg_ls_archive_statusdir() TO pg_monitor")
        drop_role(primary)


def widest_gap(readings: list[Reading]) -> float:
    """The longest span between two consecutive readings lagwatch published: the widest
    bracket of polls a change made meanwhile was dated within."""
    instants = [r.at for r in readings]
    return max((b - a for a, b in itertools.pairwise(instants)), default=0.0)


def test_a_role_without_grants_is_told_what_it_lacks(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    """No grants at all: healthy replicas read "cannot see pg_stat_wal_receiver: grant
    pg_read_all_stats" (UNKNOWN), not "not streaming" (CRITICAL); `check --grants` names
    each missing grant per node and view; pg_monitor's extra privilege is pointed out."""
    primary = pg_cluster.primary
    drop_role(primary)
    primary.execute("CREATE ROLE lagwatch LOGIN")
    pg_cluster.wait_replayed()
    config = config_as_lagwatch(pg_cluster)
    config_path = tmp_path / "lagwatch.yaml"
    config_path.write_text(yaml.safe_dump(config))
    try:
        checked = run_cli("check", "-c", str(config_path))
        assert checked.returncode == 3, checked.stdout + checked.stderr  # UNKNOWN, not CRITICAL
        assert "not streaming" not in checked.stdout, checked.stdout
        for replica in ("replica1", "replica2"):
            assert f"main/{replica}: UNKNOWN cannot see pg_stat_wal_receiver: grant pg_read_all_stats" in \
                checked.stdout, checked.stdout
        grants = run_cli("check", "--grants", "-c", str(config_path))
        assert grants.returncode == 2, grants.stdout + grants.stderr
        lines = grants.stdout.splitlines()
        assert "main/primary: MISSING for replication: GRANT pg_read_all_stats TO lagwatch" in lines, lines
        assert "main/primary: MISSING for wal_dir: GRANT EXECUTE ON FUNCTION pg_ls_waldir() TO lagwatch (without it, " \
            "not read: the size of pg_wal)" in lines, lines
        assert "main/primary: MISSING for archiver: GRANT EXECUTE ON FUNCTION pg_ls_archive_statusdir() TO " \
            "lagwatch (without it, not read: the segments waiting to be archived (pg_wal/archive_status))" in lines, \
            lines  # a room's grant, on the node that archives only
        assert sum("MISSING for archiver" in line for line in lines) == 1, lines
        assert sum("MISSING for wal_dir" in line for line in lines) == 1, lines  # pg_wal is the primary's alone
        # The daemon says a room's missing grant once at connect, and shows its view down.
        (tmp_path / "run").mkdir()
        lw = Lagwatch(tmp_path / "run", config)
        try:
            lw.wait_ready()
            lw.wait_for("wal_dir down on the primary", lambda: lw.value("lagwatch_view_up", node="primary",
                                                                        view="wal_dir") == 0, timeout=15)
            log = lw.log_text()
            assert log.count("main/primary: wal_dir: not reading the size of pg_wal: GRANT EXECUTE ON FUNCTION "
                             "pg_ls_waldir() TO lagwatch") == 1, log
            assert "cannot read wal_dir" not in log  # never tried, so never failed
            assert lw.value("lagwatch_view_up", node="replica1", view="wal_dir") is None
        finally:
            lw.stop()
        for replica in ("replica1", "replica2"):
            assert f"main/{replica}: MISSING for wal_receiver: GRANT pg_read_all_stats TO lagwatch" in lines, lines
        primary.execute("GRANT pg_monitor TO lagwatch")
        pg_cluster.wait_replayed()
        grants = run_cli("check", "--grants", "-c", str(config_path))
        assert grants.returncode == 1, grants.stdout  # WARNING: more than it needs
        assert grants.stdout.count("WARNING more than needed: pg_read_all_settings") == 3, grants.stdout
    finally:
        drop_role(primary)


def test_check_grants_flags_every_privilege_beyond_what_lagwatch_needs(pg_cluster: ChaosCluster,
                                                                       tmp_path: Path) -> None:
    """A role with everything lagwatch needs and dangerous extras: each extra named, and
    the Nagios exit code of the worst (CRITICAL for what makes a superuser)."""
    primary = pg_cluster.primary
    drop_role(primary)
    primary.execute("CREATE ROLE lagwatch LOGIN REPLICATION CREATEROLE")
    primary.execute("GRANT pg_read_all_stats, pg_signal_backend TO lagwatch")
    primary.execute("GRANT EXECUTE ON FUNCTION pg_ls_waldir() TO lagwatch")
    primary.execute("GRANT EXECUTE ON FUNCTION pg_ls_archive_statusdir() TO lagwatch")  # the primary archives
    pg_cluster.wait_replayed()
    config_path = tmp_path / "lagwatch.yaml"
    config_path.write_text(yaml.safe_dump(config_as_lagwatch(pg_cluster)))
    try:
        grants = run_cli("check", "--grants", "-c", str(config_path))
        assert grants.returncode == 1, grants.stdout + grants.stderr  # WARNING
        lines = grants.stdout.splitlines()
        for flagged in ("REPLICATION: streams the whole WAL", "CREATEROLE: creates roles",
                        "pg_signal_backend: cancels and terminates other sessions"):
            assert f"main/primary: WARNING more than needed: {flagged}" in grants.stdout, lines
        primary.execute("GRANT pg_execute_server_program, pg_write_server_files TO lagwatch")
        primary.execute("CREATE TABLE lagwatch_owned (i int)")
        primary.execute("ALTER TABLE lagwatch_owned OWNER TO lagwatch")
        pg_cluster.wait_replayed()
        grants = run_cli("check", "--grants", "-c", str(config_path))
        assert grants.returncode == 2, grants.stdout + grants.stderr  # CRITICAL
        for flagged in ("CRITICAL more than needed: pg_execute_server_program: runs programs on the server",
                        "CRITICAL more than needed: pg_write_server_files: writes files on the server",
                        "WARNING more than needed: owns 1 object(s) in this database"):
            assert f"main/primary: {flagged}" in grants.stdout, grants.stdout
        # A superuser: one CRITICAL line says it all.
        primary.execute("DROP TABLE lagwatch_owned")
        primary.execute("ALTER ROLE lagwatch SUPERUSER")
        pg_cluster.wait_replayed()
        grants = run_cli("check", "--grants", "-c", str(config_path))
        assert grants.returncode == 2, grants.stdout
        assert "main/primary: CRITICAL more than needed: superuser: every privilege there is" in grants.stdout
        # That line, "ok as lagwatch" and what its replicas are dated by.
        assert grants.stdout.count("main/primary: ") == 3, grants.stdout
    finally:
        drop_role(primary)


def test_check_grants_flags_what_a_role_gets_through_others(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    """What round two's check missed (issue 3/6, round three): membership in a superuser
    role (SET ROLE makes it one), in a role with CREATEROLE and REPLICATION, in a role that
    owns objects; EXECUTE on pg_read_binary_file; ALTER SYSTEM granted on a parameter;
    write grants on a table; pg_checkpoint. Each is named (before, the check said "ok")."""
    primary = pg_cluster.primary
    drop_role(primary)
    others = ("lw_admin", "lw_powerful", "lw_owner")
    for role in others:
        primary.execute(f"DROP ROLE IF EXISTS {role}")
    primary.execute("CREATE ROLE lagwatch LOGIN")
    primary.execute("GRANT pg_read_all_stats TO lagwatch")
    primary.execute("GRANT EXECUTE ON FUNCTION pg_ls_waldir() TO lagwatch")
    primary.execute("GRANT EXECUTE ON FUNCTION pg_ls_archive_statusdir() TO lagwatch")  # the primary archives
    primary.execute("CREATE ROLE lw_powerful NOLOGIN CREATEROLE REPLICATION")
    primary.execute("CREATE ROLE lw_owner NOLOGIN")
    primary.execute("CREATE TABLE lw_owned (i int)")
    primary.execute("ALTER TABLE lw_owned OWNER TO lw_owner")
    primary.execute("CREATE TABLE lw_writable (i int)")
    primary.execute("GRANT lw_powerful, lw_owner, pg_checkpoint TO lagwatch")
    primary.execute("GRANT EXECUTE ON FUNCTION pg_read_binary_file(text) TO lagwatch")
    primary.execute("GRANT ALTER SYSTEM ON PARAMETER log_min_messages TO lagwatch")
    primary.execute("GRANT INSERT ON lw_writable TO lagwatch")
    pg_cluster.wait_replayed()
    config_path = tmp_path / "lagwatch.yaml"
    config_path.write_text(yaml.safe_dump(config_as_lagwatch(pg_cluster)))
    try:
        grants = run_cli("check", "--grants", "-c", str(config_path))
        assert grants.returncode == 1, grants.stdout + grants.stderr  # WARNING
        for flagged in ("REPLICATION: streams the whole WAL", "CREATEROLE: creates roles",
                        "pg_checkpoint: runs CHECKPOINT",
                        "owns 1 object(s) in this database (tables, functions, schemas or the database itself), "
                        "itself or through a role it is a member of",
                        "EXECUTE on pg_read_binary_file(text): reads files on the server",
                        "writes 2 table(s) in this database",  # lw_writable by its grant, lw_owned as lw_owner
                        "ALTER SYSTEM or SET granted on parameter(s): log_min_messages"):
            assert f"main/primary: WARNING more than needed: {flagged}" in grants.stdout, grants.stdout
        # A member of a superuser role: SET ROLE postgres, and it is one.
        primary.execute("CREATE ROLE lw_admin NOLOGIN SUPERUSER")
        primary.execute("GRANT lw_admin TO lagwatch")
        pg_cluster.wait_replayed()
        grants = run_cli("check", "--grants", "-c", str(config_path))
        assert grants.returncode == 2, grants.stdout + grants.stderr  # CRITICAL
        assert "main/primary: CRITICAL more than needed: a member of a superuser role: SET ROLE makes it one" \
            in grants.stdout, grants.stdout
    finally:
        drop_role(primary)
        primary.execute("DROP TABLE IF EXISTS lw_owned, lw_writable")
        for role in others:
            primary.execute(f"DROP ROLE IF EXISTS {role}")
