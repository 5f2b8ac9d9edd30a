"""The options every cluster has, declared once: a static cluster (config/__init__.py's
ClusterConfig) and one whose members Patroni names (config/patroni.py) both derive from
them, and a discovered cluster's config carries them over by name (patroni.cluster_config).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lagwatch.config.base import LAG_FROM_WAL_MAX_BYTES, HeartbeatConfig, Schemas, SlaConfig, _Strict
from lagwatch.config.poolers import PoolerConfig


class ClusterOptions(_Strict):
    name: str = Field(min_length=1)
    # pg_walinspect FPI statistics: "auto" uses them where installed and permitted.
    walinspect: Literal["auto", "off"] = "auto"
    walinspect_max_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    # Staleness dated from the commits in the primary's WAL (pg_walinspect's
    # pg_get_wal_records_info), where installed and permitted: at most this much WAL read
    # a cycle for each place a replica's replay stands (commitscan.py).
    lag_from_wal: Literal["auto", "off"] = "auto"
    lag_from_wal_max_bytes: int = Field(default=LAG_FROM_WAL_MAX_BYTES, gt=0)
    heartbeat: HeartbeatConfig | None = None  # off unless configured: lagwatch's one write
    # The schemas lagwatch's sessions search after pg_catalog (conninfo.search_path): where
    # pg_walinspect and an unqualified heartbeat table are. Never the login's own schema.
    schemas: Schemas = Field(default=("public",), max_length=8)
    # Replication holding the vacuum horizon back by more transactions than this alerts
    # (LagwatchReplicationHoldsHorizon; exported as lagwatch_horizon_alert_xids).
    horizon_alert_xids: int = Field(default=50_000_000, gt=0)
    sla: SlaConfig = SlaConfig()
    pooler: PoolerConfig | None = None
    dry_run: bool = False  # decide, log and count pool changes, but change nothing
    # A secret from which the leader lock's key is derived, so that no other login can take
    # the lock first; every instance of an HA pair needs the same value.
    leader_lock_key: str | None = Field(default=None, min_length=8)
