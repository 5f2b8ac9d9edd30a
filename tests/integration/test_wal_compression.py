"""What wal_compression saves, on PostgreSQL 18 (pg_get_wal_block_info needs 16+): the same
update-heavy pgbench run right after a checkpoint with wal_compression off and with pglz.
The oracle is pg_walinspect's own FPI byte count of each run (pg_get_wal_stats): the
difference between the two is what compression saved, and lagwatch's
lagwatch_wal_fpi_saved_bytes_total for the pglz run must match it within 10 %."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaoscluster import ChaosCluster
from harness import Lagwatch, cluster_config
from lagwatch.demo.binaries import find_binaries
from lagwatch.demo.ports import free_port

MAJOR = 18


@pytest.fixture(scope="module")
def cluster() -> Iterator[ChaosCluster]:
    with ChaosCluster(find_binaries(MAJOR), replicas=1) as c:
        c.primary.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        subprocess.run([str(c.binaries.tool("pgbench")), "-i", "-s", "4", "-q", "-h", c.primary.host, "-p",
                        str(c.primary.port), "-U", "postgres", "postgres"],
                       check=True, capture_output=True, timeout=120)
        yield c


def lsn(c: ChaosCluster) -> str:
    return str(c.primary.scalar("SELECT pg_current_wal_insert_lsn()"))


def run(c: ChaosCluster, compression: str) -> tuple[str, str]:
    """One checkpoint, then the same pgbench (fixed seed, fixed transaction count); the WAL range."""
    c.primary.alter_system("wal_compression", compression)
    c.primary.reload()
    c.primary.execute("CHECKPOINT")
    start = lsn(c)
    subprocess.run([str(c.binaries.tool("pgbench")), "-n", "-h", c.primary.host, "-p", str(c.primary.port),
                    "-U", "postgres", "-c", "1", "-t", "3000", "--random-seed=42", "postgres"],
                   check=True, capture_output=True, timeout=300)
    return start, lsn(c)


def fpi_bytes(c: ChaosCluster, start: str, end: str) -> int:
    return int(c.primary.scalar("SELECT coalesce(sum(fpi_size), 0)::bigint FROM pg_get_wal_stats(%s, %s, false)",
                                (start, end)))


def test_saved_bytes_match_the_fpi_bytes_compression_took_away(cluster: ChaosCluster, tmp_path: Path) -> None:
    off_start, off_end = run(cluster, "off")
    fpi_off = fpi_bytes(cluster, off_start, off_end)

    # At 2 s each block read may take 0.4 s before the server cancels it (a quarter of the
    # poll's deadline): the run's 27 MB of WAL within it on a busy host too (at 500 ms,
    # 0.1 s, CI once saw it cancelled and the savings uncounted: docs/replication.md).
    config = cluster_config(cluster, free_port(["127.0.0.1"]), interval="2s", window="1m",
                            state_dir=str(tmp_path / "state"))
    config["clusters"][0]["walinspect_max_bytes"] = 256 * 1024 * 1024  # nothing skipped
    lw = Lagwatch(tmp_path, config)
    try:
        lw.wait_ready()
        lw.wait_for("WAL inspection running", lambda: lw.value("lagwatch_wal_inspected_bytes_total") is not None, 15)
        saved_before = lw.value("lagwatch_wal_fpi_saved_bytes_total", method="pglz") or 0.0
        skipped_before = lw.value("lagwatch_wal_inspect_skipped_bytes_total") or 0.0
        pglz_start, pglz_end = run(cluster, "pglz")
        fpi_pglz = fpi_bytes(cluster, pglz_start, pglz_end)
        end = int(cluster.primary.scalar("SELECT pg_wal_lsn_diff(%s, '0/0')::bigint", (pglz_end,)))
        lw.wait_for("lagwatch past the pglz run", lambda: (lw.value("lagwatch_primary_wal_lsn_bytes") or 0) >= end, 20)
        # The next inspection (every 10 s) reads up to where the primary is then: past the run.
        inspected = lw.value("lagwatch_wal_inspected_bytes_total")
        lw.wait_for("an inspection past the pglz run",
                    lambda: lw.value("lagwatch_wal_inspected_bytes_total") != inspected, 30)
        saved = (lw.value("lagwatch_wal_fpi_saved_bytes_total", method="pglz") or 0.0) - saved_before
        assert (lw.value("lagwatch_wal_inspect_skipped_bytes_total") or 0.0) == skipped_before
    finally:
        lw.stop()
        cluster.primary.alter_system("wal_compression", None)
        cluster.primary.reload()
    oracle = fpi_off - fpi_pglz
    print(f"FPI bytes: off {fpi_off}, pglz {fpi_pglz}; compression took away {oracle}; lagwatch says {saved:.0f} "
          f"saved ({saved / oracle - 1:+.1%})")
    assert fpi_off > 1_000_000 and oracle > 0.3 * fpi_off, (fpi_off, fpi_pglz)  # a real effect to measure
    assert abs(saved - oracle) <= 0.1 * oracle, (saved, oracle)
