#!/usr/bin/env python3
"""Build the lagwatch Grafana dashboard and write dashboards/lagwatch.json.

    python3 dashboards/generate.py           # regenerate lagwatch.json
    python3 dashboards/generate.py --check   # exit 1 if lagwatch.json is not what this script builds

Standard library only. The panels are described once, below, as Python: ``build_dashboard()``
turns them into Grafana's JSON model and ``panel_queries()`` lists every PromQL query with a
flag saying whether it must return data on a healthy cluster with two replicas and pool
control configured. ``substitute()`` fills in the Grafana variables the way Grafana does, so
the queries can be sent to Prometheus (or promtool) as they are.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "lagwatch.json"

UID = "lagwatch"
TITLE = "lagwatch — replica lag"
SCHEMA_VERSION = 39
GRAFANA_VERSION = "10.4.0"
DS_INPUT = "DS_PROMETHEUS"
DS: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24

# Matchers and the rate window, as Grafana sees them before substitution.
C = 'cluster=~"$cluster"'
CR = 'cluster=~"$cluster", replica=~"$replica"'
CP = 'cluster=~"$cluster", replica=~"$replica|primary"'  # pool members: the fallback primary too
RATE = "$__rate_interval"

Json = dict[str, Any]


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    must_have_data: bool = True  # on a healthy cluster with two replicas and pool control
    instant: bool = False  # an instant query shown as a table (for table/stat panels)


@dataclass
class Panel:
    title: str
    kind: str  # Grafana panel type
    description: str
    queries: list[Query]
    width: int
    height: int
    field_config: Json = field(default_factory=dict)
    options: Json = field(default_factory=dict)
    transformations: list[Json] = field(default_factory=list)


@dataclass(frozen=True)
class Annotation:
    name: str
    expr: str
    color: str
    title: str
    text: str


# -- field config helpers ------------------------------------------------------------------


def _quantile(q: str, name: str, selector: str, by: tuple[str, ...] = ()) -> str:
    """A histogram's quantile over its native series where Prometheus keeps them, else over its
    classic ``_bucket`` series: one expression for a Prometheus with native histograms on
    (which then keeps only the native series, unless always_scrape_classic_histograms, 2.x's
    scrape_classic_histograms, says otherwise) and one without (which has only the classic
    ones)."""
    native_by = f" by ({', '.join(by)})" if by else ""
    classic_by = f" by ({', '.join((*by, 'le'))})"
    return (f"histogram_quantile({q}, sum{native_by} (rate({name}{selector}[{RATE}]))) or "
            f"histogram_quantile({q}, sum{classic_by} (rate({name}_bucket{selector}[{RATE}])))")


def _thresholds(*steps: tuple[str, float | None]) -> Json:
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for color, value in steps]}


def _mapping(values: dict[str, tuple[str, str]]) -> Json:
    """A value mapping: raw value -> (text, colour)."""
    return {"type": "value", "options": {value: {"text": text, "color": color, "index": i}
                                          for i, (value, (text, color)) in enumerate(values.items())}}


def _override(ref_id: str, *properties: tuple[str, Any]) -> Json:
    return {"matcher": {"id": "byFrameRefID", "options": ref_id},
            "properties": [{"id": key, "value": value} for key, value in properties]}


def _fixed(color: str) -> Json:
    return {"mode": "fixed", "fixedColor": color}


DASHED = {"fill": "dash", "dash": [10, 10]}
DOTTED = {"fill": "dot", "dash": [0, 10]}


def _timeseries(unit: str, *, min_: float | None = 0, max_: float | None = None, fill: int = 10,
                overrides: Sequence[Json] = (), stack: bool = False) -> Json:
    custom: Json = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": fill, "showPoints": "never",
                    "spanNulls": False, "axisBorderShow": False,
                    "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
    defaults: Json = {"unit": unit, "custom": custom, "color": {"mode": "palette-classic"}}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    return {"defaults": defaults, "overrides": list(overrides)}


def _state(mappings: Sequence[Json], overrides: Sequence[Json] = ()) -> Json:
    return {"defaults": {"color": {"mode": "thresholds"}, "thresholds": _thresholds(("text", None)),
                         "mappings": list(mappings), "custom": {"fillOpacity": 80, "lineWidth": 0}},
            "overrides": list(overrides)}


TIMESERIES_OPTIONS: Json = {
    "legend": {"showLegend": True, "displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
    "tooltip": {"mode": "multi", "sort": "desc"},
}
STATE_OPTIONS: Json = {"showValue": "auto", "mergeValues": True, "alignValue": "left", "rowHeight": 0.9,
                       "legend": {"showLegend": False}, "tooltip": {"mode": "single", "sort": "none"}}


def _stat_options(text_mode: str = "value_and_name", graph: str = "area") -> Json:
    return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background", "graphMode": graph, "textMode": text_mode, "justifyMode": "auto",
            "orientation": "auto", "wideLayout": True, "showPercentChange": False}


# -- the panels, most urgent first ---------------------------------------------------------

STREAMING = _mapping({"1": ("streaming", "green"), "0": ("NOT STREAMING", "red")})
PAUSED = _mapping({"0": ("replaying", "green"), "1": ("REPLAY PAUSED", "red")})
MEMBER = _mapping({"1": ("in pool", "green"), "0": ("OUT of pool", "red")})
UP = _mapping({"1": ("up", "green"), "0": ("DOWN", "red")})
ACTIVE = _mapping({"1": ("active", "green"), "0": ("INACTIVE", "orange")})
WAL_STATUS = _mapping({"1": ("reserved", "green"), "2": ("extended", "yellow"), "3": ("unreserved", "orange"),
                       "4": ("LOST", "red"), "0": ("unknown", "text")})


def _lag_row() -> list[Panel]:
    by_replica = "{{cluster}}/{{replica}}"
    return [
        Panel(
            "Staleness now (vs SLA)", "stat",
            "Staleness, the headline lag: age of the oldest change the replica has not replayed yet, measured on "
            "lagwatch's own clock. 0 when fully replayed (and on an idle primary). Red: above this replica's SLA "
            "max_lag (the pool ejects it after eject_after cycles). Green: within SLA. Blue: replica not in "
            "lagwatch's config, so no SLA. No value at all: lagwatch is not scraped or cannot tell.",
            [Query(f"max by (cluster, replica) (lagwatch_replica_lag_seconds{{{CR}}}) > on (cluster, replica) "
                   f"max by (cluster, replica) (lagwatch_replica_sla_max_lag_seconds{{{CR}}})", by_replica, False),
             Query(f"max by (cluster, replica) (lagwatch_replica_lag_seconds{{{CR}}}) <= on (cluster, replica) "
                   f"max by (cluster, replica) (lagwatch_replica_sla_max_lag_seconds{{{CR}}})", by_replica),
             Query(f"max by (cluster, replica) (lagwatch_replica_lag_seconds{{{CR}}}) unless on (cluster, replica) "
                   f"lagwatch_replica_sla_max_lag_seconds{{{CR}}}", by_replica, False)],
            16, 5,
            {"defaults": {"unit": "s", "min": 0, "decimals": 1, "color": _fixed("blue"), "noValue": "no data"},
             "overrides": [_override("A", ("color", _fixed("red"))), _override("B", ("color", _fixed("green")))]},
            _stat_options()),
        Panel(
            "Replicas in read pool", "stat",
            "How many replicas lagwatch's decision puts in the pooler's read pool (lagwatch_pool_member), per "
            "cluster. Red at 0. 'PRIMARY serving reads' means too few replicas are healthy and "
            "fallback_to_primary added the primary to the read pool. Empty without pool control.",
            [Query(f"sum by (cluster) (max by (cluster, replica) "
                   f"(lagwatch_pool_member{{{C}, replica!=\"primary\"}}))", "{{cluster}} replicas in pool"),
             Query(f"max by (cluster) (lagwatch_pool_member{{{C}, replica=\"primary\"}})", "{{cluster}} primary",
                   False)],
            8, 5,
            {"defaults": {"unit": "none", "min": 0, "decimals": 0, "color": {"mode": "thresholds"},
                          "thresholds": _thresholds(("red", None), ("green", 1))},
             "overrides": [_override("B", ("mappings", [_mapping({"1": ("PRIMARY serving reads", "orange"),
                                                                   "0": ("primary not in pool", "green")})]))]},
            _stat_options(graph="none")),
        Panel(
            "Staleness (headline lag)", "timeseries",
            "Staleness: age of the oldest change the replica has not replayed. 0 on an idle primary; grows with "
            "wall time while replay is paused under writes, and while replication is cut off. Solid: staleness "
            "now. Dotted: p95 over lagwatch's window. Dashed red: the replica's SLA max_lag; above it the "
            "replica is ejected from the read pool after eject_after cycles (see the eject/readmit annotations).",
            [Query(f"max by (cluster, replica) (lagwatch_replica_lag_seconds{{{CR}}})", by_replica),
             Query(f"max by (cluster, replica) (lagwatch_replica_lag_window_seconds{{{CR}, quantile=\"0.95\"}})",
                   f"{by_replica} p95 over window"),
             Query(f"max by (cluster, replica) (lagwatch_replica_sla_max_lag_seconds{{{CR}}})",
                   f"{by_replica} SLA max_lag")],
            16, 9,
            _timeseries("s", overrides=[
                _override("B", ("custom.lineStyle", DOTTED), ("custom.fillOpacity", 0)),
                _override("C", ("custom.lineStyle", DASHED), ("custom.fillOpacity", 0), ("custom.lineWidth", 2),
                          ("color", _fixed("red")))]),
            TIMESERIES_OPTIONS),
        Panel(
            "Pool membership", "state-timeline",
            "Whether lagwatch's decision puts each member in the pooler's read pool ('primary' is the "
            "fallback), and what the pooler itself reports when read back. The two should agree within a "
            "cycle; if they do not, applying to the pooler is failing (see Pool apply errors). Operator "
            "holds are shown when in force. Eject/readmit annotations mark every change.",
            [Query(f"max by (cluster, replica) (lagwatch_pool_member{{{CP}}})", f"{by_replica} decision"),
             Query(f"max by (cluster, replica) (lagwatch_pool_pooler_member{{{CP}}})", f"{by_replica} pooler"),
             Query(f"max by (cluster, replica, hold) (lagwatch_pool_held{{{CR}}})",
                   f"{by_replica} held {{{{hold}}}}", False)],
            8, 9,
            _state([MEMBER], [_override("C", ("mappings", [_mapping({"1": ("operator hold", "purple")})]))]),
            STATE_OPTIONS),
        Panel(
            "Byte lag by stage", "timeseries",
            "How far behind each replica is in bytes: the primary's current LSN minus the replica's sent, "
            "write, flush and replay LSN (pg_stat_replication). Replay bytes that keep growing while the "
            "others stay small mean replay is stuck or paused. 'received, not replayed' is the replica's own "
            "view; it reads 0 when replication is cut off, because nothing arrives.",
            [Query(f"max by (cluster, replica, stage) (lagwatch_replica_lag_bytes{{{CR}}})",
                   f"{by_replica} {{{{stage}}}}"),
             Query(f"max by (cluster, replica) (lagwatch_replica_receive_replay_bytes{{{CR}}})",
                   f"{by_replica} received, not replayed")],
            8, 8, _timeseries("bytes"), TIMESERIES_OPTIONS),
        Panel(
            "Walsender lags (write/flush/replay)", "timeseries",
            "write_lag, flush_lag and replay_lag from pg_stat_replication. They move only when the standby "
            "reports in: with replay paused they freeze shortly after writes stop, and they read 0 when "
            "caught up (NULL). A second opinion, not the headline: use Staleness for decisions.",
            [Query(f"max by (cluster, replica, stage) (lagwatch_replica_walsender_lag_seconds{{{CR}}})",
                   f"{by_replica} {{{{stage}}}}")],
            8, 8, _timeseries("s"), TIMESERIES_OPTIONS),
        Panel(
            "Streaming / replay paused", "state-timeline",
            "Per replica: is its WAL receiver streaming (red: NOT STREAMING, it is cut off from the primary "
            "and falling behind while the primary writes), and is replay paused (red: REPLAY PAUSED, by "
            "pg_wal_replay_pause() or a requested pause).",
            [Query(f"max by (cluster, replica) (lagwatch_replica_streaming{{{CR}}})", f"{by_replica} receiver"),
             Query(f"max by (cluster, replica) (lagwatch_replica_replay_paused{{{CR}}})", f"{by_replica} replay")],
            8, 8,
            _state([STREAMING], [_override("B", ("mappings", [PAUSED]))]),
            STATE_OPTIONS),
        Panel(
            "Staleness distribution (selected replicas together)", "timeseries",
            "p50/p95/p99 of every per-cycle staleness sample of the selected replicas, from the "
            "lagwatch_replica_lag_sampled_seconds histogram summed over replicas: its native series where "
            "Prometheus keeps them (exponential buckets, 0.3 % wide near a held replica's lag), else its "
            "classic buckets (0.5 ms to 10 min, interpolated within a bucket). Shows how bad lag gets "
            "across the fleet, not per replica.",
            [Query(_quantile(q, "lagwatch_replica_lag_sampled_seconds", f"{{{CR}}}"), f"p{label}")
             for q, label in (("0.5", "50"), ("0.95", "95"), ("0.99", "99"))],
            12, 8, _timeseries("s", fill=0), TIMESERIES_OPTIONS),
        Panel(
            "Timestamp signal (misleading on idle primary) — NOT lag", "timeseries",
            "now() - pg_last_xact_replay_timestamp() on each replica, the signal many exporters call lag. It "
            "is NOT lag: it grows on an idle primary (60 s without writes reads as 60 s), so it pages people "
            "for nothing at night. Shown only to compare; decide on Staleness.",
            [Query(f"max by (cluster, replica) (lagwatch_replica_last_replay_timestamp_age_seconds{{{CR}}})",
                   f"{by_replica} timestamp age", False)],
            12, 8, _timeseries("s", fill=0), TIMESERIES_OPTIONS),
        Panel(
            "Replay rate vs WAL generation", "timeseries",
            "How fast each replica replays WAL (since replay last stood still, within forecast_horizon) "
            "against how fast the primary writes it (dashed). A replica behind whose line stays under the "
            "dashed one will not catch up by waiting (an IOPS-capped volume, heavy full-page images).",
            [Query(f"max by (cluster, replica) (lagwatch_replica_replay_rate_bytes_per_second{{{CR}}})",
                   f"{by_replica} replays"),
             Query(f"max by (cluster) (lagwatch_wal_rate_bytes_per_second{{{C}}})", "{{cluster}} primary writes")],
            12, 8, _timeseries("Bps", overrides=[_override("B", ("custom.lineStyle", DASHED),
                                                            ("custom.fillOpacity", 0))]),
            TIMESERIES_OPTIONS),
        Panel(
            "Catch-up ETA", "timeseries",
            "When each replica will have replayed everything at the current rates: backlog / (replay rate - "
            "WAL generation rate). 0: caught up. Shown capped at a day: at the cap it is not catching up "
            "(lagwatch_replica_catchup_eta_seconds is +Inf; LagwatchReplicaNotCatchingUp after 5 minutes).",
            [Query(f"clamp_max(max by (cluster, replica) (lagwatch_replica_catchup_eta_seconds{{{CR}}}), 86400)",
                   f"{by_replica} ETA")],
            12, 8, _timeseries("s", fill=0), TIMESERIES_OPTIONS),
    ]


def _slots_wal_row() -> list[Panel]:
    by_slot = "{{cluster}}/{{slot}}"
    return [
        Panel(
            "Slot runway (until safe_wal_size is 0)", "timeseries",
            "Seconds until each slot with a max_slot_wal_keep_size limit runs out of safe_wal_size at the "
            "current net rate (WAL written minus WAL its consumer releases, over forecast_horizon). Then its "
            "WAL becomes unreserved and is lost at the next checkpoint. Capped at a week: at the cap the "
            "slot's safe size does not shrink. Warning under 4 h, page under 30 min.",
            [Query(f"clamp_max(min by (cluster, slot) (lagwatch_slot_runway_seconds{{{C}}}), 604800)",
                   f"{by_slot} runway", False)],
            12, 8, _timeseries("s", fill=0), TIMESERIES_OPTIONS),
        Panel(
            "WAL saved by wal_compression", "timeseries",
            "Share of the WAL that compression of full-page images saved: their uncompressed size (page less "
            "its hole) minus their stored size, over the WAL that would have been written without it "
            "(pg_get_wal_block_info, PostgreSQL 16+; needs pg_walinspect and its grant).",
            [Query(f"sum by (cluster) (rate(lagwatch_wal_fpi_saved_bytes_total{{{C}}}[{RATE}])) / "
                   f"(sum by (cluster) (rate(lagwatch_wal_inspected_bytes_total{{{C}}}[{RATE}])) + "
                   f"sum by (cluster) (rate(lagwatch_wal_fpi_saved_bytes_total{{{C}}}[{RATE}])))",
                   "{{cluster}} saved", False)],
            12, 8, _timeseries("percentunit", max_=1), TIMESERIES_OPTIONS),
        Panel(
            "WAL pinned by slots without a limit", "timeseries",
            "For slots with no max_slot_wal_keep_size: the WAL each retains as a share of the pg_wal "
            "directory (needs EXECUTE on pg_ls_waldir()). Nothing stops such a slot from filling the disk.",
            [Query(f"max by (cluster, slot) (lagwatch_slot_wal_dir_share{{{C}}})", f"{by_slot}", False)],
            12, 8, _timeseries("percentunit", max_=1), TIMESERIES_OPTIONS),
        Panel(
            "Slot retained WAL vs safe_wal_size", "timeseries",
            "WAL each replication slot holds back on the primary (pg_current_wal_lsn() - restart_lsn), and "
            "how much more can be written before the slot is in danger of losing its WAL (safe_wal_size, "
            "dashed; absent when max_slot_wal_keep_size is unlimited, then pg_wal can fill the disk). Slots "
            "follow flush, not replay: a paused replica's slot retains ~0 bytes.",
            [Query(f"max by (cluster, slot) (lagwatch_slot_retained_bytes{{{C}}})", f"{by_slot} retained"),
             Query(f"max by (cluster, slot) (lagwatch_slot_safe_wal_size_bytes{{{C}}})", f"{by_slot} safe_wal_size",
                   False)],
            12, 8,
            _timeseries("bytes", overrides=[_override("B", ("custom.lineStyle", DASHED), ("custom.fillOpacity", 0))]),
            TIMESERIES_OPTIONS),
        Panel(
            "Slot state (wal_status, consumer)", "state-timeline",
            "Each slot's wal_status: reserved (fine), extended (past max_wal_size, still kept), unreserved "
            "(will be lost at the next checkpoint), LOST (the replica needs a new base backup). And whether a "
            "consumer is connected: an INACTIVE slot retains WAL until it is dropped.",
            [Query(f"max by (cluster, slot) (lagwatch_slot_wal_status{{{C}, status=\"reserved\"}} * 1 "
                   f"or lagwatch_slot_wal_status{{{C}, status=\"extended\"}} * 2 "
                   f"or lagwatch_slot_wal_status{{{C}, status=\"unreserved\"}} * 3 "
                   f"or lagwatch_slot_wal_status{{{C}, status=\"lost\"}} * 4)", f"{by_slot} wal_status"),
             Query(f"max by (cluster, slot) (lagwatch_slot_active{{{C}}})", f"{by_slot} consumer")],
            12, 8,
            _state([WAL_STATUS], [_override("B", ("mappings", [ACTIVE]))]),
            STATE_OPTIONS),
        Panel(
            "WAL generation rate", "timeseries",
            "How fast the primary writes WAL: lagwatch's own measure over the last minute (from "
            "pg_current_wal_lsn()), and pg_stat_wal's wal_bytes counter (PostgreSQL 14+). Replicas must "
            "replay at least this fast to keep up.",
            [Query(f"max by (cluster) (lagwatch_wal_rate_bytes_per_second{{{C}}})", "{{cluster}} LSN rate (1m)"),
             Query(f"max by (cluster) (rate(lagwatch_wal_bytes_total{{{C}}}[{RATE}]))", "{{cluster}} pg_stat_wal")],
            8, 8, _timeseries("Bps"), TIMESERIES_OPTIONS),
        Panel(
            "Full-page images in WAL", "timeseries",
            "Share of full-page images (FPI): bytes share in the WAL inspected by pg_walinspect last cycle "
            "(lagwatch_wal_fpi_share; absent without pg_walinspect), the same over the rate window, and FPIs "
            "per WAL record from pg_stat_wal. A high share after each checkpoint is normal; a "
            "persistently high one inflates WAL (consider wal_compression, longer checkpoint_timeout).",
            [Query(f"max by (cluster) (lagwatch_wal_fpi_share{{{C}}})", "{{cluster}} FPI bytes share (last cycle)",
                   False),
             Query(f"max by (cluster) (rate(lagwatch_wal_inspected_fpi_bytes_total{{{C}}}[{RATE}])) / "
                   f"max by (cluster) (rate(lagwatch_wal_inspected_bytes_total{{{C}}}[{RATE}]))",
                   "{{cluster}} FPI bytes share (rate window)", False),
             Query(f"max by (cluster) (rate(lagwatch_wal_fpi_total{{{C}}}[{RATE}])) / "
                   f"max by (cluster) (rate(lagwatch_wal_records_total{{{C}}}[{RATE}]))",
                   "{{cluster}} FPIs per record")],
            8, 8, _timeseries("percentunit", max_=1, fill=0), TIMESERIES_OPTIONS),
        Panel(
            "pg_wal directory size", "timeseries",
            "Size of the primary's pg_wal directory (needs pg_monitor), with max_slot_wal_keep_size dashed "
            "when set. Growth here with large slot retention means a slot is holding WAL back.",
            [Query(f"max by (cluster) (lagwatch_wal_directory_bytes{{{C}}})", "{{cluster}} pg_wal"),
             Query(f"max by (cluster) (lagwatch_max_slot_wal_keep_size_bytes{{{C}}})",
                   "{{cluster}} max_slot_wal_keep_size", False)],
            8, 8,
            _timeseries("bytes", overrides=[_override("B", ("custom.lineStyle", DASHED), ("custom.fillOpacity", 0))]),
            TIMESERIES_OPTIONS),
        Panel(
            "WAL compression", "stat",
            "wal_compression on the primary (off, pglz, lz4, zstd; a boolean 'on' before PostgreSQL 15 is "
            "pglz). Compressing full-page images cuts WAL volume, and so replication bytes.",
            [Query(f"max by (cluster, method) (lagwatch_wal_compression_info{{{C}}}) == 1",
                   "{{cluster}}: {{method}}")],
            6, 6,
            {"defaults": {"color": _fixed("blue"), "noValue": "unknown (PostgreSQL < 14?)"}, "overrides": []},
            _stat_options(text_mode="name", graph="none")),
        Panel(
            "Replication slots now", "table",
            "Every slot on the primary: type, wal_status, whether a consumer is connected, and for logical "
            "slots database/plugin, conflicting and invalidation_reason where the server reports them.",
            [Query(f"max by (cluster, slot, slot_type, database, plugin, temporary, conflicting, invalidation_reason, "
                   f"status) ((lagwatch_slot_info{{{C}}} * on (cluster, slot, instance) group_left (status) "
                   f"(lagwatch_slot_wal_status{{{C}}} == 1) or on (cluster, slot, instance) lagwatch_slot_info{{{C}}}) "
                   f"* on (cluster, slot, instance) group_left lagwatch_slot_active{{{C}}})", instant=True)],
            18, 6,
            {"defaults": {"custom": {"align": "auto", "cellOptions": {"type": "auto"}}},
             "overrides": [
                 {"matcher": {"id": "byName", "options": "consumer"},
                  "properties": [{"id": "mappings", "value": [ACTIVE]},
                                 {"id": "custom.cellOptions", "value": {"type": "color-text"}}]},
                 {"matcher": {"id": "byName", "options": "status"},
                  "properties": [{"id": "mappings", "value": [_mapping({
                      "reserved": ("reserved", "green"), "extended": ("extended", "yellow"),
                      "unreserved": ("unreserved", "orange"), "lost": ("LOST", "red")})]},
                                 {"id": "custom.cellOptions", "value": {"type": "color-text"}}]}]},
            {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}},
            [{"id": "organize", "options": {"excludeByName": {"Time": True},
                                            "renameByName": {"Value": "consumer"},
                                            "indexByName": {"cluster": 0, "slot": 1, "slot_type": 2, "status": 3,
                                                            "Value": 4}}}]),
    ]


COMMITS = _mapping({"0": ("commits complete", "green"), "1": ("COMMITS STALL", "red")})
SYNC_STATE = _mapping({"1": ("async", "text"), "2": ("potential", "blue"), "3": ("sync", "green"),
                       "4": ("quorum", "green")})


def _fleet_table(title: str, description: str, expr: str, unit: str, value_name: str,
                 must_have_data: bool) -> Panel:
    """An instant table of one value per cluster (or replica, or slot): at 300 clusters it
    scrolls, sorted worst first, where a graph would be 300 lines."""
    return Panel(
        title, "table", description, [Query(expr, must_have_data=must_have_data, instant=True)], 8, 9,
        {"defaults": {"unit": unit, "custom": {"align": "auto", "cellOptions": {"type": "auto"}}}, "overrides": []},
        {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}},
        [{"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": {"Value": value_name}}}])


def _fleet_row() -> list[Panel]:
    return [
        _fleet_table(
            "Clusters by worst p95 staleness",
            "Every cluster, worst first: the highest p95 staleness of any of its replicas over lagwatch's "
            "window (one row per cluster however many lagwatch instances or shards report it).",
            f'sort_desc(max by (cluster) (lagwatch_replica_lag_window_seconds{{{C}, quantile="0.95"}}))',
            "s", "worst p95", True),
        _fleet_table(
            "Replicas out of the read pool",
            "Every replica lagwatch keeps out of its cluster's read pool now (ejected, held out, or not "
            "replicating from the current primary): the reason is on /status and in lagwatch's log.",
            f'max by (cluster, replica) (lagwatch_pool_member{{{C}, replica!="primary"}}) == 0',
            "none", "in pool", False),
        _fleet_table(
            "Slots by runway",
            "Slots whose safe_wal_size shrinks, soonest lost first: seconds until max_slot_wal_keep_size "
            "invalidates them at the current net rate (slots that do not shrink are left out).",
            f"sort(min by (cluster, slot) (lagwatch_slot_runway_seconds{{{C}}}) < Inf)",
            "s", "runway", False),
    ]


def _sync_row() -> list[Panel]:
    by_replica = "{{cluster}}/{{replica}}"
    return [
        Panel(
            "Synchronous commits", "state-timeline",
            "Whether commits on the primary can complete: COMMITS STALL when fewer standbys named in "
            "synchronous_standby_names are connected and streaming than FIRST n / ANY n requires, while "
            "synchronous_commit waits on them (remote_write, on, remote_apply). Every writing transaction "
            "then hangs until a standby returns.",
            [Query(f"max by (cluster) (lagwatch_sync_commit_at_risk{{{C}}})", "{{cluster}}")],
            8, 8, _state([COMMITS]), STATE_OPTIONS),
        Panel(
            "Synchronous standbys: healthy vs required", "timeseries",
            "Listed standbys connected and streaming, against how many each commit waits for (dashed). At "
            "the dashed line there is no spare: one more loss stalls commits. 0 required: no synchronous "
            "replication configured.",
            [Query(f"max by (cluster) (lagwatch_sync_standbys_healthy{{{C}}})", "{{cluster}} healthy"),
             Query(f"max by (cluster) (lagwatch_sync_standbys_required{{{C}}})", "{{cluster}} required")],
            8, 8, _timeseries("none", overrides=[_override("B", ("custom.lineStyle", DASHED),
                                                            ("custom.fillOpacity", 0))]),
            TIMESERIES_OPTIONS),
        Panel(
            "Commit wait for standbys", "timeseries",
            "What each commit waits for now: the write, flush or replay lag (as synchronous_commit says) of "
            "the standbys it waits for (FIRST n: the slowest of the n sync ones; ANY n: the n-th fastest), "
            "as the primary measures it. Commit latency added by replication; absent without synchronous "
            "standbys or while commits stall.",
            [Query(f"max by (cluster) (lagwatch_sync_commit_wait_seconds{{{C}}})", "{{cluster}}", False)],
            8, 8, _timeseries("s"), TIMESERIES_OPTIONS),
        Panel(
            "Replica sync state", "state-timeline",
            "Each replica's sync_state in pg_stat_replication: async (commits never wait for it), potential "
            "(next in line under FIRST n), sync (commits wait for it), quorum (one of ANY n). Read-pool "
            "membership does not depend on it.",
            [Query(f"max by (cluster, replica) (lagwatch_replica_sync_state{{{CR}, state=\"async\"}} * 1 "
                   f"or lagwatch_replica_sync_state{{{CR}, state=\"potential\"}} * 2 "
                   f"or lagwatch_replica_sync_state{{{CR}, state=\"sync\"}} * 3 "
                   f"or lagwatch_replica_sync_state{{{CR}, state=\"quorum\"}} * 4)", by_replica)],
            WIDTH, 6, _state([SYNC_STATE]), STATE_OPTIONS),
    ]


# The diagnosis' causes (lagwatch.estimate.diagnosis.CAUSES), each shown as an index in the state timeline.
CAUSES = ("caught_up", "apply_delay", "replay_paused", "recovery_conflict", "replay_busy", "not_streaming",
          "network", "sender", "unknown")
CAUSE_COLOURS = {"caught_up": "green", "apply_delay": "blue", "replay_paused": "orange",
                 "recovery_conflict": "red", "replay_busy": "purple", "not_streaming": "dark-red",
                 "network": "yellow", "sender": "light-orange", "unknown": "text"}
CAUSE = _mapping({str(i): (cause, CAUSE_COLOURS[cause]) for i, cause in enumerate(CAUSES, 1)})


def _why_row() -> list[Panel]:
    by_replica = "{{cluster}}/{{replica}}"
    # A state set: the current cause's series is 1, the others 0; each times its index, the max is the index.
    cause_index = " or ".join(f'lagwatch_replica_lag_cause{{{CR}, cause="{cause}"}} * {i}'
                              for i, cause in enumerate(CAUSES, 1))
    return [
        Panel(
            "What holds each replica back", "state-timeline",
            "The cause of the largest part of each replica's staleness, every cycle: caught_up; apply_delay "
            "(recovery_min_apply_delay); replay_paused; recovery_conflict (replay waits on a query on the "
            "replica: /status and lagwatch check name the session); replay_busy (the startup process is "
            "replaying flat out: replay is the bottleneck); not_streaming (no WAL receiver: cut off, or "
            "replaying from the archive); network (sent, not yet written by the replica); sender (the "
            "primary has not sent it); unknown (the startup process is hidden from lagwatch's role).",
            [Query(f"max by (cluster, replica) ({cause_index})", by_replica)],
            WIDTH, 6, _state([CAUSE]), STATE_OPTIONS),
        Panel(
            "Where the lag sits", "timeseries",
            "The staleness split by where the oldest missing change is: send (the primary has not sent it), "
            "write (sent, not yet written by the replica), flush (written, not flushed), replay (on the "
            "replica's disk, not replayed). Stacked, the stages add up to the headline staleness.",
            [Query(f"max by (cluster, replica, stage) (lagwatch_replica_lag_stage_seconds{{{CR}}})",
                   "{{replica}} {{stage}}")],
            12, 8, _timeseries("s", stack=True), TIMESERIES_OPTIONS),
        Panel(
            "Replay busy ratio", "timeseries",
            "Share of lagwatch's window (one sample a cycle) that found the replica's startup process replaying "
            "rather than waiting for WAL: how close replay is to its limit. Near 1 (dashed red at 0.9), a "
            "replica that keeps up now falls behind at the next write spike: the replica's I/O, "
            "recovery_prefetch and maintenance_io_concurrency are where to look.",
            [Query(f"max by (cluster, replica) (lagwatch_replica_replay_busy_ratio{{{CR}}})", by_replica),
             Query(f"max by (cluster, replica) (lagwatch_replica_replay_busy_ratio{{{CR}}}) * 0 + 0.9",
                   f"{by_replica} limit")],
            6, 8, _timeseries("percentunit", max_=1, overrides=[
                _override("B", ("custom.lineStyle", DASHED), ("custom.fillOpacity", 0), ("color", _fixed("red")))]),
            TIMESERIES_OPTIONS),
        Panel(
            "Queries cancelled by recovery conflicts", "timeseries",
            "Queries on each replica cancelled because replay needed what they held, by conflict type "
            "(pg_stat_database_conflicts: snapshot, lock, bufferpin, tablespace, deadlock, active_logicalslot). "
            "Each is an error for the application reading from the pool, even at zero lag: "
            "hot_standby_feedback and max_standby_streaming_delay trade them against lag.",
            [Query(f"max by (cluster, replica, type) (increase(lagwatch_replica_recovery_conflicts_total{{{CR}}}"
                   f"[{RATE}]))", "{{replica}} {{type}}")],
            6, 8, _timeseries("short", stack=True), TIMESERIES_OPTIONS),
    ]


def _logical_row() -> list[Panel]:
    by_consumer = "{{cluster}}/{{consumer}} ({{slot}})"
    # None on a cluster with no logical slot: each query may be empty.
    return [
        Panel(
            "Logical consumers: staleness", "timeseries",
            "Each subscription or change-data-capture client, by its slot: age of the oldest change on the "
            "primary it has not applied or confirmed (dated from the WAL's commit times where permitted). "
            "Never a read replica: not in the lag panels above, never in a pool. A consumer that confirms every "
            "few seconds (pg_recvlogical, Debezium) reads up to that between confirmations. Dashed: its p95 "
            "over the window.",
            [Query(f"max by (cluster, consumer, slot) (lagwatch_logical_staleness_seconds{{{C}}})", by_consumer,
                   must_have_data=False),
             Query(f'max by (cluster, consumer, slot) (lagwatch_logical_staleness_window_seconds{{{C}, '
                   f'quantile="0.95"}})', f"{by_consumer} p95", must_have_data=False)],
            12, 8, _timeseries("s", overrides=[_override("B", ("custom.lineStyle", DASHED),
                                                         ("custom.fillOpacity", 0))]), TIMESERIES_OPTIONS),
        Panel(
            "Logical consumers: WAL not confirmed", "timeseries",
            "The primary's current WAL position less what each consumer applied or confirmed. Its slot keeps "
            "at least this much WAL (the Slots & WAL row shows what it retains).",
            [Query(f"max by (cluster, consumer, slot) (lagwatch_logical_lag_bytes{{{C}}})", by_consumer,
                   must_have_data=False)],
            6, 8, _timeseries("bytes"), TIMESERIES_OPTIONS),
        Panel(
            "Logical consumers: connected", "state-timeline",
            "1 while a walsender streams from the consumer's slot; 0 while nothing does (a subscription "
            "disabled, a CDC client stopped): its slot then holds WAL and the catalog horizon for as long.",
            [Query(f"max by (cluster, consumer, slot) (lagwatch_logical_consumer_active{{{C}}})", by_consumer,
                   must_have_data=False)],
            6, 8, _state([_mapping({"0": ("disconnected", "red"), "1": ("streaming", "green")})]),
            STATE_OPTIONS),
        Panel(
            "Subscriptions: apply errors", "timeseries",
            "On a subscriber lagwatch watches: errors per second applying each subscription's changes and "
            "copying its tables (pg_stat_subscription_stats, 15+), and conflicts by type (18+). An apply error "
            "stops the worker, which retries the same transaction: nothing after it is applied until the "
            "cause is fixed (LagwatchSubscriptionApplyErrors).",
            [Query(f"max by (cluster, subscription) (rate(lagwatch_subscription_apply_errors_total{{{C}}}[{RATE}]))",
                   "{{cluster}}/{{subscription}} apply", must_have_data=False),
             Query(f"max by (cluster, subscription) (rate(lagwatch_subscription_sync_errors_total{{{C}}}[{RATE}]))",
                   "{{cluster}}/{{subscription}} sync", must_have_data=False),
             Query(f"max by (cluster, subscription, type) (rate(lagwatch_subscription_conflicts_total{{{C}}}"
                   f"[{RATE}]))", "{{cluster}}/{{subscription}} {{type}}", must_have_data=False)],
            12, 7, _timeseries("short", fill=0), TIMESERIES_OPTIONS),
        Panel(
            "Subscriptions: worker and last message", "timeseries",
            "Seconds since each subscription's apply worker last heard from its publisher (data or keepalive); "
            "absent while no worker runs (LagwatchSubscriptionWorkerDown once enabled and so for 5 minutes).",
            [Query(f"max by (cluster, subscription) (lagwatch_subscription_last_message_age_seconds{{{C}}})",
                   "{{cluster}}/{{subscription}}", must_have_data=False)],
            12, 7, _timeseries("s"), TIMESERIES_OPTIONS),
    ]


def _archive_row() -> list[Panel]:
    by_node = "{{cluster}}/{{node}}"
    return [
        Panel(
            "WAL archiving: waiting", "timeseries",
            "Segments waiting to be archived on each node that archives (the primary; a standby only with "
            "archive_mode = always), and how long the oldest has waited (right axis): the archive and "
            "point-in-time recovery are that far behind, and pg_wal keeps all of it (LagwatchArchiveBehind). "
            "Not the last archived file's age, which grows on an idle primary.",
            [Query(f"max by (cluster, node) (lagwatch_archive_waiting_segments{{{C}}})", f"{by_node} waiting"),
             Query(f"max by (cluster, node) (lagwatch_archive_oldest_waiting_age_seconds{{{C}}})",
                   f"{by_node} oldest waited")],
            12, 7, _timeseries("short", fill=0, overrides=[_override("B", ("unit", "s"),
                                                                     ("custom.axisPlacement", "right"))]),
            TIMESERIES_OPTIONS),
        Panel(
            "WAL archiving: archived and failed", "timeseries",
            "WAL files archived per second, and failed attempts per second (red): a failing archive_command "
            "retries the same segment, so nothing after it is archived (LagwatchArchiveFailing).",
            [Query(f"max by (cluster, node) (rate(lagwatch_archive_archived_total{{{C}}}[{RATE}]))",
                   f"{by_node} archived"),
             Query(f"max by (cluster, node) (rate(lagwatch_archive_failed_total{{{C}}}[{RATE}]))",
                   f"{by_node} failed")],
            12, 7, _timeseries("short", fill=0, overrides=[_override("B", ("color", _fixed("red")))]),
            TIMESERIES_OPTIONS),
    ]


def _lagwatch_row() -> list[Panel]:
    this_cluster = f"on (instance) lagwatch_up{{{C}}}"  # daemon-wide series of instances watching $cluster
    by_node = "{{cluster}}/{{node}} ({{instance}})"
    return [
        Panel(
            "Last poll age", "stat",
            "Seconds since each lagwatch instance published its last poll cycle. It should stay near the poll "
            "interval: orange over 30 s, red over 120 s (the thresholds assume an interval of 10 s or less). "
            "No value: Prometheus is not scraping lagwatch, so every other panel is blind too.",
            [Query(f"time() - max by (instance) (lagwatch_last_poll_timestamp_seconds and {this_cluster})",
                   "{{instance}}")],
            4, 7,
            {"defaults": {"unit": "s", "min": 0, "decimals": 1, "color": {"mode": "thresholds"},
                          "noValue": "NOT SCRAPED", "thresholds": _thresholds(("green", None), ("orange", 30),
                                                                                ("red", 120))},
             "overrides": []},
            _stat_options(text_mode="value", graph="area")),
        Panel(
            "Nodes up", "state-timeline",
            "Whether each node (primary and replicas) answered lagwatch's last poll. DOWN means lagwatch "
            "could not connect or the poll timed out (see Poll errors by kind); staleness then falls back "
            "to the primary's view of the replica.",
            [Query(f"lagwatch_up{{{C}}}", by_node)],
            10, 7, _state([UP]), STATE_OPTIONS),
        Panel(
            "Poll duration per node", "timeseries",
            "Time lagwatch spent on each node in the last cycle: one statement and round trip per node, bounded "
            "by query_timeout. Close to the interval means polls are about to time out.",
            [Query(f"lagwatch_poll_duration_seconds{{{C}}}", by_node)],
            10, 7, _timeseries("s"), TIMESERIES_OPTIONS),
        Panel(
            "Poll errors by kind", "timeseries",
            "Failed polls per second by node and kind: connect (cannot reach or log in), timeout (client-side "
            "deadline), query (SQL error), role (the node is not the role configured, e.g. after a failover).",
            [Query(f"sum by (cluster, node, kind, instance) (rate(lagwatch_poll_errors_total{{{C}}}[{RATE}]))",
                   "{{cluster}}/{{node}} {{kind}} ({{instance}})")],
            6, 7, _timeseries("short", fill=0), TIMESERIES_OPTIONS),
        Panel(
            "Cycle duration", "timeseries",
            "Duration of lagwatch's whole poll cycle (all nodes concurrently), its p99 over the rate interval "
            "(from the lagwatch_cycle_seconds histogram; keep it under half the interval), and overruns per "
            "second: cycles that took longer than the interval or were skipped because the previous one still ran.",
            [Query(f"lagwatch_cycle_duration_seconds and {this_cluster}", "{{instance}} cycle"),
             Query(f"rate(lagwatch_cycle_overruns_total[{RATE}]) and {this_cluster}", "{{instance}} overruns/s"),
             Query(f"({_quantile('0.99', 'lagwatch_cycle_seconds', '', ('instance',))}) and {this_cluster}",
                   "{{instance}} p99")],
            6, 7,
            _timeseries("s", overrides=[_override("B", ("unit", "short"), ("custom.axisPlacement", "right"))]),
            TIMESERIES_OPTIONS),
        Panel(
            "Interval and loop lag", "timeseries",
            "The interval each lagwatch instance keeps (solid) against its configured interval (dashed): above "
            "it when cycles do not fit, so lagwatch stretched its interval instead of falling behind (it logs a "
            "WARNING a minute at most meanwhile; LagwatchOverloaded pages after 5 minutes of it). Staleness is "
            "then read less often and pool decisions come later. Dotted: how late lagwatch's own event loop was, "
            "at worst, to get to what it waited for in the last cycle; high with a stretched interval means a "
            "busy host or too big a fleet for one instance.",
            [Query(f"lagwatch_effective_interval_seconds and {this_cluster}", "{{instance}} effective interval"),
             Query(f"lagwatch_interval_seconds and {this_cluster}", "{{instance}} configured interval"),
             Query(f"lagwatch_loop_lag_seconds and {this_cluster}", "{{instance}} loop lag")],
            6, 7,
            _timeseries("s", overrides=[
                _override("B", ("custom.lineStyle", DASHED), ("custom.fillOpacity", 0), ("custom.lineWidth", 2)),
                _override("C", ("custom.lineStyle", DOTTED), ("custom.fillOpacity", 0))]),
            TIMESERIES_OPTIONS),
        Panel(
            "Late answers, nodes connecting", "timeseries",
            "Node answers per second that lagwatch got to too late to count for or against their node: a "
            "cluster with one keeps its previous state for that cycle (no node read down, no pool decision), "
            "since a busy lagwatch is no evidence against a node. Above 0 for long: lagwatch is overloaded (see "
            "Interval and loop lag). Right axis: nodes still making their first connection after a start; they "
            "read neither up nor down until they answer.",
            [Query(f"rate(lagwatch_late_answers_total[{RATE}]) and {this_cluster}", "{{instance}} late answers/s"),
             Query(f"lagwatch_nodes_connecting and {this_cluster}", "{{instance}} nodes connecting")],
            6, 7,
            _timeseries("short", fill=0, overrides=[_override("B", ("custom.axisPlacement", "right"),
                                                               ("decimals", 0))]),
            TIMESERIES_OPTIONS),
        Panel(
            "Leader / dry run", "state-timeline",
            "Which lagwatch instance holds the cluster's advisory-lock leadership and applies pool changes "
            "(exactly one should be leader), and whether pool control is in dry run (decides and counts, "
            "changes nothing).",
            [Query(f"lagwatch_leader{{{C}}}", "{{cluster}} {{instance}} leader"),
             Query(f"lagwatch_pool_dry_run{{{C}}}", "{{cluster}} {{instance}} mode")],
            12, 7,
            _state([_mapping({"1": ("leader", "blue"), "0": ("standby", "text")})],
                   [_override("B", ("mappings", [_mapping({"1": ("DRY RUN", "orange"),
                                                           "0": ("applying", "green")})]))]),
            STATE_OPTIONS),
        Panel(
            "Pooler errors", "timeseries",
            "Failed attempts per second to make the pooler match lagwatch's decision (retried with backoff; "
            "the pooler keeps its previous config), and to read its own view of the pool (pooler down or "
            "unreachable). Non-zero for long: the pool is not what the dashboard above says lagwatch decided.",
            [Query(f"rate(lagwatch_pool_apply_errors_total{{{C}}}[{RATE}])", "apply {{cluster}} {{instance}}"),
             Query(f"rate(lagwatch_pool_read_errors_total{{{C}}}[{RATE}])", "read {{cluster}} {{instance}}")],
            12, 7, _timeseries("short", fill=0), TIMESERIES_OPTIONS),
    ]


ROWS: tuple[tuple[str, Callable[[], list[Panel]]], ...] = (
    ("Lag", _lag_row),
    ("Why replicas lag", _why_row),
    ("Fleet", _fleet_row),
    ("Synchronous replication", _sync_row),
    ("Slots & WAL", _slots_wal_row),
    ("WAL archiving", _archive_row),
    ("Logical replication", _logical_row),
    ("lagwatch itself", _lagwatch_row),
)


def _panels() -> list[tuple[str, list[Panel]]]:
    return [(title, make()) for title, make in ROWS]


def _annotations() -> list[Annotation]:
    def changed(action: str) -> str:
        counter = f'lagwatch_pool_changes_total{{{C}, action="{action}"}}'
        # changes() misses a member's first change: its counter series is created at 1.
        return f"(changes({counter}[$__interval]) > 0) or ({counter} unless {counter} offset $__interval)"

    return [
        Annotation("Pool: eject", changed("eject"), "red", "eject {{replica}}",
                   "lagwatch took {{replica}} out of the read pool of {{cluster}}"),
        Annotation("Pool: readmit", changed("readmit"), "green", "readmit {{replica}}",
                   "lagwatch put {{replica}} back into the read pool of {{cluster}}"),
    ]


VARIABLE_QUERIES: tuple[tuple[str, str, str], ...] = (
    # name, metric selector, label
    ("cluster", "lagwatch_up", "cluster"),
    ("replica", 'lagwatch_replica_lag_seconds{cluster=~"$cluster"}', "replica"),
)


# -- JSON model ----------------------------------------------------------------------------


def _target(query: Query, ref_id: str) -> Json:
    target: Json = {"datasource": DS, "editorMode": "code", "expr": query.expr, "legendFormat": query.legend,
                    "refId": ref_id}
    if query.instant:
        target.update({"instant": True, "range": False, "format": "table"})
    else:
        target.update({"instant": False, "range": True})
    return target


def _layout() -> list[Json]:
    """Grafana panels with ids and gridPos: rows of width 24, panels left to right, wrapping."""
    out: list[Json] = []
    y = 0
    next_id = 1
    for row_title, panels in _panels():
        out.append({"type": "row", "id": next_id, "title": row_title, "collapsed": False, "panels": [],
                    "gridPos": {"x": 0, "y": y, "w": WIDTH, "h": 1}})
        next_id += 1
        y += 1
        x = 0
        line_height = 0
        for p in panels:
            if x + p.width > WIDTH:
                x, y, line_height = 0, y + line_height, 0
            panel: Json = {
                "type": p.kind, "id": next_id, "title": p.title, "description": p.description, "datasource": DS,
                "gridPos": {"x": x, "y": y, "w": p.width, "h": p.height},
                "targets": [_target(q, chr(ord("A") + i)) for i, q in enumerate(p.queries)],
                "fieldConfig": p.field_config, "options": p.options,
            }
            if p.transformations:
                panel["transformations"] = p.transformations
            out.append(panel)
            next_id += 1
            x += p.width
            line_height = max(line_height, p.height)
        y += line_height
    return out


def _templating() -> list[Json]:
    variables: list[Json] = [{
        "type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
        "current": {"selected": False, "text": "${" + DS_INPUT + "}", "value": "${" + DS_INPUT + "}"},
        "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1, "regex": "",
        "skipUrlSync": False,
    }]
    for name, selector, label in VARIABLE_QUERIES:
        query = f"label_values({selector}, {label})"
        variables.append({
            "type": "query", "name": name, "label": name.capitalize(), "datasource": DS,
            "definition": query, "query": query, "refresh": 2, "regex": "", "sort": 1,
            "multi": True, "includeAll": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": [],
            "hide": 0, "skipUrlSync": False,
        })
    return variables


def _annotation_list() -> list[Json]:
    builtin: Json = {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
                     "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
                     "type": "dashboard"}
    return [builtin] + [{
        "datasource": DS, "enable": True, "hide": False, "iconColor": a.color, "name": a.name, "expr": a.expr,
        "step": "", "titleFormat": a.title, "textFormat": a.text, "tagKeys": "cluster,replica",
        "useValueForTime": False,
    } for a in _annotations()]


def build_dashboard() -> dict[str, Any]:
    panels = _layout()
    panel_types = sorted({p["type"] for p in panels if p["type"] != "row"})
    panel_names = {"stat": "Stat", "table": "Table", "timeseries": "Time series", "state-timeline": "State timeline"}
    return {
        "__inputs": [{"name": DS_INPUT, "label": "Prometheus", "description": "Prometheus that scrapes lagwatch",
                      "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "__elements": {},
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_VERSION},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            *({"type": "panel", "id": t, "name": panel_names.get(t, t), "version": ""} for t in panel_types),
        ],
        "annotations": {"list": _annotation_list()},
        "description": "PostgreSQL replica lag as lagwatch measures it (staleness), pool control, slots and WAL, "
                       "and lagwatch itself. Generated by dashboards/generate.py: edit that, not this file.",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [],
        "liveNow": False,
        "panels": panels,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["lagwatch", "postgresql", "replication"],
        "templating": {"list": _templating()},
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": TITLE,
        "uid": UID,
        "version": 1,
        "weekStart": "",
    }


def panel_queries() -> list[tuple[str, str, bool]]:
    """Every PromQL query of the dashboard: (panel title, expr, must have data on a healthy cluster).

    "Healthy cluster" is a primary and two streaming replicas with replication slots, pool control
    configured, lagwatch connecting with pg_monitor (or as superuser), scraped for a few seconds.
    Annotation queries and the selectors behind the template variables are listed too.
    """
    out = [(p.title, q.expr, q.must_have_data) for _, panels in _panels() for p in panels for q in p.queries]
    out += [(f"annotation: {a.name}", a.expr, False) for a in _annotations()]
    out += [(f"variable: {name}", selector, True) for name, selector, _ in VARIABLE_QUERIES]
    return out


# -- Grafana's variable substitution -------------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_VAR = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
_REGEX_SPECIAL = re.compile(r"[\\^$*+?.()|\[\]{}]")


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", duration.strip())
    if match is None:
        raise ValueError(f"not a duration: {duration!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0 and ms >= size:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _regex_value(value: str | Sequence[str]) -> str:
    """A multi-value variable inside a =~ matcher: a str is used as it is (e.g. the All value
    ".*"); a list of values is regex-escaped (doubly, as in a PromQL string) and joined as (a|b)."""
    if isinstance(value, str):
        return value
    escaped = [_REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), v) for v in value]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, cluster: str | Sequence[str] = "main", replica: str | Sequence[str] = ".*",
               interval: str = "1m", *, scrape_interval: str = "15s", range_: str = "1h") -> str:
    """``expr`` with Grafana's variables replaced as Grafana would for a Prometheus data source.

    $__rate_interval is max($__interval + scrape interval, 4 * scrape interval), the scrape
    interval being the data source's setting (Grafana's default: 15s).
    """
    step = _seconds(interval)
    scrape = _seconds(scrape_interval)
    span = _seconds(range_)
    values = {
        "cluster": _regex_value(cluster),
        "replica": _regex_value(replica),
        "__interval": _duration(step),
        "__interval_ms": str(round(step * 1000)),
        "__rate_interval": _duration(max(step + scrape, 4 * scrape)),
        "__range": _duration(span),
        "__range_s": str(round(span)),
        "__range_ms": str(round(span * 1000)),
    }

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise ValueError(f"unknown variable ${name} in {expr!r}")
        return values[name]

    return _VAR.sub(replace, expr)


# -- command line --------------------------------------------------------------------------


def render() -> str:
    return json.dumps(build_dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if lagwatch.json differs from the build")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"default: {OUTPUT}")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run python3 dashboards/generate.py", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date")
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
