"""lagwatch as the role from deploy/sql/ (pg_monitor, not a superuser) exports every
metric of issue 1/4 except what is documented as needing more (pg_walinspect's FPI stats)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from chaoscluster import ChaosCluster
from harness import ROOT, Lagwatch, Writer, cluster_config
from lagwatch.localcluster import free_port

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
]
NEEDS_MORE = ["lagwatch_wal_inspected_bytes_total", "lagwatch_wal_inspected_fpi_bytes_total"]


def test_monitoring_role_is_enough(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    primary = pg_cluster.primary
    primary.execute("DROP ROLE IF EXISTS lagwatch")
    psql = str(pg_cluster.binaries.tool("psql"))
    subprocess.run([psql, "-X", "-v", "ON_ERROR_STOP=1", "-h", primary.host, "-p", str(primary.port), "-U", "postgres",
                    "-d", "postgres", "-f", str(ROLE_SQL)], check=True, capture_output=True, timeout=60)
    assert primary.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'lagwatch'") == [(False,)]
    pg_cluster.wait_replayed()

    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]))
    cluster = config["clusters"][0]
    for node in [cluster["primary"], *cluster["replicas"]]:
        node["dsn"] = node["dsn"].replace("user=postgres", "user=lagwatch")
    lw = Lagwatch(tmp_path, config)
    try:
        lw.wait_ready()
        with Writer(pg_cluster):
            time.sleep(3)
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
        assert log.count("not reading walinspect") == 1 and "pg_read_server_files" in log
        assert "wal_dir" not in log  # pg_monitor may read pg_ls_waldir()
    finally:
        lw.stop()
        primary.execute("DROP ROLE IF EXISTS lagwatch")


def test_a_view_denied_at_run_time_leaves_the_node_up(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    """Grants taken away while lagwatch runs (pg_ls_waldir(), pg_walinspect): those views
    read 0 in lagwatch_view_up, with one warning naming the grant; the node stays up and
    its lag is still measured."""
    primary = pg_cluster.primary
    primary.execute("DROP ROLE IF EXISTS lagwatch")
    primary.execute("CREATE ROLE lagwatch LOGIN; GRANT pg_monitor, pg_read_server_files TO lagwatch")
    pg_cluster.wait_replayed()
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]))
    cluster = config["clusters"][0]
    for node in [cluster["primary"], *cluster["replicas"]]:
        node["dsn"] = node["dsn"].replace("user=postgres", "user=lagwatch")
    lw = Lagwatch(tmp_path, config)
    try:
        lw.wait_ready()
        with Writer(pg_cluster):
            lw.wait_for("every view read", lambda: all(lw.value("lagwatch_view_up", node="primary", view=v) == 1
                                                        for v in ("server", "replication", "slots", "wal_dir",
                                                                  "walinspect")), timeout=15)
            primary.execute("REVOKE EXECUTE ON FUNCTION pg_ls_waldir() FROM pg_monitor; "
                            "REVOKE pg_read_server_files FROM lagwatch")
            lw.wait_for("the denied views down", lambda: lw.value("lagwatch_view_up", node="primary", view="wal_dir")
                        == 0 and lw.value("lagwatch_view_up", node="primary", view="walinspect") == 0, timeout=15)
            pg_cluster.replicas[0].pause_replay()
            time.sleep(3.0)
            lag = lw.value("lagwatch_replica_lag_seconds", replica="replica1")
            assert lag is not None and 2.0 <= lag <= 4.0, lag
        assert lw.value("lagwatch_up", node="primary") == 1
        for view in ("server", "replication", "slots", "wal"):
            assert lw.value("lagwatch_view_up", node="primary", view=view) == 1, view
        assert (lw.value("lagwatch_view_errors_total", node="primary", view="wal_dir") or 0) >= 1
        log = lw.log_text()
        # Said once per node that reads it (the revoke replicates to the replicas).
        assert log.count("cannot read wal_dir") == 3 and "pg_ls_waldir() needs pg_monitor" in log
        assert log.count("cannot read walinspect") == 1 and "pg_read_server_files" in log
    finally:
        lw.stop()
        primary.execute("GRANT EXECUTE ON FUNCTION pg_ls_waldir() TO pg_monitor")
        primary.execute("DROP ROLE IF EXISTS lagwatch")
