"""lagwatch as the role from deploy/sql/ (pg_monitor, not a superuser) exports every
metric of issue 1/4 except what is documented as needing more (pg_walinspect's FPI stats)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from harness import ROOT, Lagwatch, Writer, cluster_config
from lagwatch.localcluster import LocalCluster, free_port

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


def test_monitoring_role_is_enough(pg_cluster: LocalCluster, tmp_path: Path) -> None:
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
