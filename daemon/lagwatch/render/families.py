"""Every metric family lagwatch exports: its name, type, labels and help, in one list.

The rooms (lagwatch.rooms: a view with everything about it) declare their own families
here, each in its section, after this module's; export.py fills them from a snapshot;
every family here is declared (``# HELP`` and ``# TYPE``) on every scrape, whatever its
series, so that a dashboard or a rule can be checked against any live scrape;
``docs/metrics.md`` is generated from this list (``python3 -m lagwatch.serve.export``, with the
rooms'), and a test fails when the two disagree.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from itertools import groupby
from typing import Generic, TypeVar

from lagwatch.render.exposition import Counter, Family, Gauge, Histogram, Info, Summary

AS_OF = " (as of last poll)"
F = TypeVar("F", bound=Family, covariant=True)


@dataclass(frozen=True)
class Spec(Generic[F]):
    """One family: ``make`` gives it for this collection (exposition.collecting: the one
    family of that name, made once)."""

    name: str
    cls: type[F]
    help: str
    labels: tuple[str, ...]
    section: str

    def make(self) -> F:
        return self.cls(self.name, self.help, labels=self.labels)

    def add(self: Spec[Gauge], labels: list[str], value: float) -> None:
        """A gauge's (or counter's) one sample in this collection (a fleet adds each
        cluster's to the one family of its name)."""
        self.make().add_metric(labels, value)

    @property
    def kind(self) -> str:
        return self.cls.kind

    @property
    def series(self) -> str:
        """The name its samples carry: a counter's ``_total``, an info's ``_info``."""
        return f"{self.name}_total" if self.kind == "counter" else f"{self.name}_info" if self.kind == "info" \
            else self.name


CATALOGUE: dict[str, Spec[Family]] = {}
_section = ""
T = TypeVar("T", bound=Family)


def _spec(cls: type[T], name: str, text: str, *labels: str, as_of: bool = False, section: str | None = None) -> Spec[T]:
    spec = Spec(name, cls, text + (AS_OF if as_of else ""), labels, section or _section)
    assert name not in CATALOGUE, name
    CATALOGUE[name] = spec
    return spec


def gauge(name: str, text: str, *labels: str, section: str | None = None) -> Spec[Gauge]:
    """A gauge of the cluster's state: its help says it is as of the last poll. ``section``:
    a room's own (rooms/), else the one this module is declaring."""
    return _spec(Gauge, name, text, *labels, as_of=True, section=section)


def counter(name: str, text: str, *labels: str, section: str | None = None) -> Spec[Counter]:
    return _spec(Counter, name, text, *labels, section=section)


def info(name: str, text: str, *labels: str, section: str | None = None) -> Spec[Info]:
    """An info family (``NAME_info``, 1 per label set) of the cluster's state, as of the last poll."""
    return _spec(Info, name, text, *labels, as_of=True, section=section)


C, R, N, S = "cluster", "replica", "node", "slot"

# -- lagwatch itself ----------------------------------------------------------------------
_section = "lagwatch itself"
CYCLE_DURATION = _spec(Gauge, "lagwatch_cycle_duration_seconds", "Duration of the last poll cycle", as_of=True)
CYCLE_WINDOW = _spec(Summary, "lagwatch_cycle_duration_window_seconds", "Quantiles of the last 600 cycles' "
                     "durations (nearest rank; quantile=1 is the max; the first cycle, which connects, left out); "
                     "_sum and _count over every cycle since start but the first")
CYCLES_HISTOGRAM = _spec(Histogram, "lagwatch_cycle_seconds", "Histogram of every cycle's duration since start "
                         "(the first cycle, which connects, left out)")
FIRST_CYCLE = _spec(Gauge, "lagwatch_first_cycle_duration_seconds", "Duration of the first cycle after start, "
                    "which connects to every node")
CYCLES = counter("lagwatch_cycles", "Poll cycles completed")
OVERRUNS = counter("lagwatch_cycle_overruns", "Cycles that took longer than the interval, or were skipped because "
                   "the previous one was still running")
LAST_POLL = _spec(Gauge, "lagwatch_last_poll_timestamp_seconds", "Unix time the last cycle was published")
INTERVAL = _spec(Gauge, "lagwatch_interval_seconds", "The configured poll interval")
EFFECTIVE_INTERVAL = _spec(Gauge, "lagwatch_effective_interval_seconds", "The interval lagwatch keeps now: longer "
                           "than the configured one while its cycles do not fit that (LagwatchOverloaded)")
LOOP_LAG = _spec(Gauge, "lagwatch_loop_lag_seconds", "The worst lateness of lagwatch's own event loop since the "
                 "previous cycle: how late it was to get to what it waited for (a busy host, a fleet too big for "
                 "the interval)")
LATE_ANSWERS = counter("lagwatch_late_answers", "Node answers lagwatch got to too late to count for or against "
                       "their node: their cluster kept its previous state that cycle (no node read down, no pool "
                       "decision)")
CONNECTING = _spec(Gauge, "lagwatch_nodes_connecting", "Nodes still making their first connection: they read "
                   "neither up nor down, and their cluster is published once each of its nodes has answered or "
                   "failed")
# The names Prometheus and Alertmanager use for the same thing.
RELOAD_OK = _spec(Gauge, "lagwatch_config_last_reload_successful", "1 if the last config reload was put in "
                  "force, 0 if it was rejected (the running config stays)")
RELOAD_AT = _spec(Gauge, "lagwatch_config_last_reload_success_timestamp_seconds", "Unix time the config in "
                  "force was loaded")
BACKGROUND_ERRORS = counter("lagwatch_background_errors", "Background tasks that failed (each logged with its "
                            "trace)")
SHARD = gauge("lagwatch_shard", "1: this instance watches the clusters rendezvous hashing gives shard index of "
              "count", "index", "count")
CLUSTER_FILE_ERRORS = gauge("lagwatch_cluster_config_errors", "1 if the clusters_dir file does not validate as it "
                            "is (a new one is not watched; a changed one keeps its last good version), else 0",
                            "file")

# -- the HTTP server (web.py: added to each scrape as it is served) ----------------------
_section = "the HTTP server"
HTTP_CONNECTIONS = _spec(Gauge, "lagwatch_http_connections", "Open HTTP connections.")
HTTP_CAP = _spec(Gauge, "lagwatch_http_connection_cap", "Open HTTP connections allowed (kept below the descriptor "
                 "limit).")
HTTP_CLOSED = counter("lagwatch_http_connections_closed", "HTTP connections closed early, by reason.", "reason")
METRICS_RENDERS = counter("lagwatch_http_metrics_renders", "Snapshots rendered for /metrics: ahead of a scrape the "
                          "scrapers' pace said was due (ahead), or when a scrape asked (asked: each such scrape "
                          "waited for it).", "when")
METRICS_SERVED = counter("lagwatch_http_metrics_served", "/metrics answers, by what they were served from: a render "
                         "ready in memory (ready), one they waited for (waited: under way when they came, or "
                         "their own).", "how")

# -- discovery ----------------------------------------------------------------------------
_section = "Patroni discovery"
DISCOVERY_UP = gauge("lagwatch_discovery_up", "1 if the cluster's members were discovered in the last cycle; 0 if "
                     "Patroni did not answer usefully (the last known members stay in force)", C)
DISCOVERY_MEMBERS = gauge("lagwatch_discovery_members", "Members in force for the cluster (the last known ones "
                          "while discovery is down)", C)
DISCOVERY_ERRORS = counter("lagwatch_discovery_errors", "Failed attempts to discover the cluster's members", C)
DISCOVERY_SUCCESS = gauge("lagwatch_discovery_last_success_timestamp_seconds", "Unix time the cluster's members "
                          "were last discovered", C)
PATRONI_MEMBER = _spec(Info, "lagwatch_patroni_member", "Each discovered member's role and state as Patroni said "
                       "last (role: leader, replica, sync_standby, quorum_standby, standby_leader)",
                       C, "member", "role", "state")

# -- nodes --------------------------------------------------------------------------------
_section = "nodes"
UP = gauge("lagwatch_up", "1 if the node answered the last poll, else 0", C, N)
POLL_DURATION = gauge("lagwatch_poll_duration_seconds", "Time spent polling the node", C, N)
POLLS = counter("lagwatch_polls", "Polls attempted per node", C, N)
CONNECTS = counter("lagwatch_connects", "Connection attempts per node (one persistent session each: this grows "
                   "only on reconnects)", C, N)
POLL_ERRORS = counter("lagwatch_poll_errors", "Failed polls per node by kind (connect, timeout, query)", C, N, "kind")
VIEW_UP = gauge("lagwatch_view_up", "1 if the view was read from the node in the last poll; 0 if it failed, rests "
                "after a failure, or the role may not read it", C, N, "view")
VIEW_ERRORS = counter("lagwatch_view_errors", "Failed reads of a view, per node", C, N, "view")
NODE_INFO = _spec(Info, "lagwatch_node", "Observed role and server version of each node", C, N, "role",
                  "server_version_num", as_of=True)

# -- roles --------------------------------------------------------------------------------
_section = "roles"
NODE_ROLE = gauge("lagwatch_node_role", "1 for the node's role as observed in the last poll (primary: accepts "
                  "writes; unknown: no answer), 0 for the others", C, N, "role")
NODE_TIMELINE = gauge("lagwatch_node_timeline", "The timeline a primary writes on, or a replica's WAL receiver last "
                      "received on", C, N)
PRIMARIES = gauge("lagwatch_cluster_primaries", "Distinct servers of the cluster that accept writes (2 or more: "
                  "split brain; one server reached under two names counts once)", C)
ROLE_CHANGES = counter("lagwatch_cluster_role_changes", "Nodes seen to change role (replica to primary or back) "
                       "since lagwatch started", C)

# -- replicas -----------------------------------------------------------------------------
_section = "replicas"
LAG = gauge("lagwatch_replica_lag_seconds", "Staleness: age of the oldest change the replica has not replayed, "
            "measured on lagwatch's monotonic clock; 0 when fully replayed", C, R)
LAG_WINDOW = _spec(Summary, "lagwatch_replica_lag_window_seconds", "Quantiles of staleness over the window "
                   "(nearest rank; quantile=1 is the max); _sum and _count over every sample since start",
                   C, R, as_of=True)
LAG_WINDOW_SAMPLES = gauge("lagwatch_replica_lag_window_samples", "Staleness samples in the window", C, R)
LAG_HISTOGRAM = _spec(Histogram, "lagwatch_replica_lag_sampled_seconds", "Histogram of every per-cycle "
                      "staleness sample since start", C, R)
LAG_BYTES = gauge("lagwatch_replica_lag_bytes", "Primary's current WAL LSN minus the replica's sent/write/flush/"
                  "replay LSN from pg_stat_replication", C, R, "stage")
WALSENDER_LAG = gauge("lagwatch_replica_walsender_lag_seconds", "write_lag/flush_lag/replay_lag from "
                      "pg_stat_replication; NULL while caught up is reported as 0", C, R, "stage")
PAUSED = gauge("lagwatch_replica_replay_paused", "1 if WAL replay is paused or a pause was requested", C, R)
STREAMING = gauge("lagwatch_replica_streaming", "1 if the replica's WAL receiver is streaming", C, R)
RECEIVE_REPLAY = gauge("lagwatch_replica_receive_replay_bytes", "Received but not yet replayed WAL, on the replica",
                       C, R)
REPLAY_TIMESTAMP_AGE = gauge("lagwatch_replica_last_replay_timestamp_age_seconds", "now() - "
                             "pg_last_xact_replay_timestamp() on the replica. NOT lag: it grows on an idle "
                             "primary", C, R)
FOLLOWS = gauge("lagwatch_replica_follows_primary", "1 if the replica replicates from the current primary (the "
                "primary streams to it, or it receives on the primary's timeline), else 0", C, R)
CONFIGURED = gauge("lagwatch_replica_configured", "1 if the replica is in lagwatch's config, 0 if only seen in "
                   "pg_stat_replication", C, R)
REPLICA_INFO = _spec(Info, "lagwatch_replica", "State of the replica", C, R, "state", "sync_state",
                     "wal_receiver_status", "lag_source", "lag_evidence", as_of=True)
REPLAY_RATE = gauge("lagwatch_replica_replay_rate_bytes_per_second", "How fast the replica replays WAL: since "
                    "replay last stood still, within forecast_horizon", C, R)
BACKLOG = gauge("lagwatch_replica_catchup_backlog_bytes", "WAL the primary wrote that the replica has not "
                "replayed", C, R)
ETA = gauge("lagwatch_replica_catchup_eta_seconds", "When the replica will have replayed everything: the backlog "
            "over (replay rate - WAL generation rate); 0 when caught up, +Inf when not catching up", C, R)
SLA_MAX_LAG = gauge("lagwatch_replica_sla_max_lag_seconds", "The replica's SLA max_lag from the config", C, R)
SLA_P95 = gauge("lagwatch_replica_sla_p95_seconds", "The replica's SLA p95 from the config (absent if unset)", C, R)
MIN_REPLICAS = gauge("lagwatch_pool_min_replicas", "The cluster's SLA min_replicas from the config", C)

# -- why replicas lag ----------------------------------------------------------------------
_section = "why replicas lag"
LAG_CAUSE = gauge("lagwatch_replica_lag_cause", "1 for what holds the replica's staleness back now (the cause of "
                  "its largest part: caught_up, apply_delay, replay_paused, recovery_conflict, replay_busy, "
                  "not_streaming, network, sender, unknown), 0 for the others", C, R, "cause")
LAG_STAGE = gauge("lagwatch_replica_lag_stage_seconds", "The staleness split by where the oldest missing change "
                  "sits: send (not yet sent), write (sent, not written by the replica), flush (written, not "
                  "flushed), replay (flushed, not replayed); the stages add up to lagwatch_replica_lag_seconds",
                  C, R, "stage")
LAG_STAGE_BYTES = gauge("lagwatch_replica_lag_stage_bytes", "WAL at each stage (send, write, flush, replay) "
                        "between the primary's position and the replica's replay position", C, R, "stage")
REPLAY_BUSY = gauge("lagwatch_replica_replay_busy_ratio", "Share of the window's samples (one a cycle) that found "
                    "the replica's startup process replaying rather than waiting (for WAL, an apply delay, a "
                    "pause or a conflict): near 1, replay is at its limit", C, R)
STARTUP_READS = counter("lagwatch_replica_startup_reads", "Blocks of relation data the replica's startup process "
                        "has read (pg_stat_io, PostgreSQL 16+), since its statistics were reset", C, R)
CONFLICTS = counter("lagwatch_replica_recovery_conflicts", "Queries on the replica cancelled by hot-standby "
                    "conflicts, by type (pg_stat_database_conflicts summed over databases), since its statistics "
                    "were reset", C, R, "type")
CONFLICT_HOLDERS = gauge("lagwatch_replica_recovery_conflict_sessions", "While replay waits on a conflict, the "
                         "sessions on the replica named as holding it: a lock's holders; for a snapshot, a buffer pin "
                         "or a tablespace, the sessions holding a snapshot, candidates (at most 5; 0 when replay does "
                         "not wait)", C, R)
CONFLICT_HOLDER = gauge("lagwatch_replica_recovery_conflict_holder_xact_seconds", "While replay waits on a "
                        "conflict: the oldest session named as holding it, with the age of its transaction (one "
                        "series per replica, absent otherwise: a new pid is a new series only once per conflict)",
                        C, R, "pid", "user", "conflict")

# -- logical consumers --------------------------------------------------------------------
_section = "logical replication"
LC = "consumer"
LOGICAL_STALENESS = gauge("lagwatch_logical_staleness_seconds", "Logical consumer (a subscription or a change-data-"
                          "capture client, by its slot): age of the oldest change on the primary it has not applied "
                          "or confirmed; never a read replica (docs/replication.md)", C, LC, S)
LOGICAL_WINDOW = gauge("lagwatch_logical_staleness_window_seconds", "Quantiles of the consumer's staleness over the "
                       "window (nearest rank; quantile=1 is the max)", C, LC, S, "quantile")
LOGICAL_BYTES = gauge("lagwatch_logical_lag_bytes", "Primary's current WAL LSN minus what the consumer applied or "
                      "confirmed (the slot's confirmed_flush_lsn while nothing streams from it)", C, LC, S)
LOGICAL_ACTIVE = gauge("lagwatch_logical_consumer_active", "1 if a walsender streams from the consumer's slot", C, LC,
                       S)
LOGICAL_INFO = _spec(Info, "lagwatch_logical_consumer", "The consumer's walsender state, database, output plugin "
                     "and what dated its staleness", C, LC, S, "state", "database", "plugin", "evidence", as_of=True)


# -- WAL ----------------------------------------------------------------------------------
_section = "WAL"
PRIMARY_LSN = gauge("lagwatch_primary_wal_lsn_bytes", "Primary's current WAL LSN as a byte position", C)
WAL_RATE = gauge("lagwatch_wal_rate_bytes_per_second", "WAL generation rate over forecast_horizon (a minute by "
                 "default)", C)
WAL_INSPECTED = counter("lagwatch_wal_inspected_bytes", "WAL bytes read by pg_walinspect", C)
WAL_DATING_READ = counter("lagwatch_wal_dating_read_bytes", "WAL bytes read with pg_walinspect to date "
                          "replicas' staleness from commit times (lag_from_wal): counted by pg_get_wal_stats "
                          "or described by pg_get_wal_records_info", C)
WAL_DATING_READS = counter("lagwatch_wal_dating_reads", "Reads of commit times from the primary's WAL "
                           "(lag_from_wal), one a cycle at most", C)
WAL_DATING_CANCELLED = counter("lagwatch_wal_dating_reads_cancelled", "Reads of commit times the primary cancelled "
                               "at their time budget (the replicas are dated by the LSN clock that cycle)", C)
WAL_DATING_FAILED = counter("lagwatch_wal_dating_reads_failed", "Reads of commit times that failed otherwise "
                            "(the replicas are dated by the LSN clock that cycle)", C)
WAL_DATING_RETRIED = counter("lagwatch_wal_dating_reads_retried", "Reads of commit times run again without a range "
                             "that held no whole record yet (a replica caught up to a record still being written, "
                             "or to a segment's end)", C)
HEARTBEAT_BEATS = counter("lagwatch_heartbeat_beats", "Heartbeats written on the primary (the optional heartbeat)", C)
HEARTBEAT_ERRORS = counter("lagwatch_heartbeat_errors", "Heartbeat writes or connections that failed", C)
WAL_INSPECTED_FPI = counter("lagwatch_wal_inspected_fpi_bytes", "Full-page image bytes in the inspected WAL (after "
                            "compression)", C)
WAL_INSPECT_SKIPPED = counter("lagwatch_wal_inspect_skipped_bytes", "WAL bytes not inspected because a cycle's cap "
                              "was reached", C)
WAL_FPI_SHARE = gauge("lagwatch_wal_fpi_share", "Share of full-page image bytes in the WAL inspected last (every "
                      "10 s; 0-1)", C)
WAL_FPI_SAVED = counter("lagwatch_wal_fpi_saved_bytes", "Bytes WAL compression saved on full-page images: their "
                        "size uncompressed (page less its hole) minus as stored, by wal_compression method "
                        "(pg_get_wal_block_info, PostgreSQL 16+)", C, "method")
WAL_FPI_STORED = counter("lagwatch_wal_fpi_compressed_bytes", "Compressed full-page image bytes as stored in the "
                         "inspected WAL, by method", C, "method")
WAL_FPI_IMAGES = counter("lagwatch_wal_fpi_compressed_images", "Compressed full-page images in the inspected WAL, "
                         "by method", C, "method")

# -- pool control -------------------------------------------------------------------------
_section = "pool control"
LEADER = gauge("lagwatch_leader", "1 if this instance holds the cluster's leader lock and applies pool changes", C)
LEADER_HOLDER = gauge("lagwatch_leader_holder_info", "1 for the session holding the cluster's leader lock (this "
                      "instance's own, another lagwatch's, or a stranger's: then no instance applies pool changes)",
                      C, "pid", "application_name", "user", "lagwatch")
DRY_RUN = gauge("lagwatch_pool_dry_run", "1 if pool changes are decided and counted but not applied", C)
APPLY_ERRORS = counter("lagwatch_pool_apply_errors", "Failed attempts to make the pooler match the decision", C)
READ_ERRORS = counter("lagwatch_pool_read_errors", "Failed attempts to read the pooler's own view of its read pool "
                      "(pooler down, admin console or socket unreachable)", C)
POOL_MEMBER = gauge("lagwatch_pool_member", "1 if lagwatch's decision puts the member (replica, or 'primary' as a "
                    "fallback) in the read pool", C, R)
POOLER_MEMBER = gauge("lagwatch_pool_pooler_member", "1 if the pooler itself reports the member in its read pool",
                      C, R)
POOL_CHANGES = counter("lagwatch_pool_changes", "Pool changes decided, by member and action (eject, readmit, add, "
                       "remove); counted in dry runs too", C, R, "action")
POOL_HELD = gauge("lagwatch_pool_held", "1 while an operator hold (in or out) overrides automation", C, R, "hold")

# -- synchronous replication --------------------------------------------------------------
_section = "synchronous replication"
SYNC_REQUIRED = gauge("lagwatch_sync_standbys_required", "Standbys each commit waits for, from "
                      "synchronous_standby_names (FIRST n / ANY n; 0: none)", C)
SYNC_HEALTHY = gauge("lagwatch_sync_standbys_healthy", "Standbys named in synchronous_standby_names that are "
                     "connected and streaming", C)
SYNC_WAITS = gauge("lagwatch_sync_commit_waits_on_standbys", "1 if commits wait on standbys: standbys required and "
                   "synchronous_commit is remote_write, on or remote_apply", C)
SYNC_AT_RISK = gauge("lagwatch_sync_commit_at_risk", "1 if fewer standbys are healthy than commits wait for: "
                     "commits on the primary stall until one returns", C)
SYNC_WAIT = gauge("lagwatch_sync_commit_wait_seconds", "What a commit waits for now: the write, flush or replay lag "
                  "(as synchronous_commit says) of the standbys it waits for (absent when none or unknown)", C)
SYNC_STATE = gauge("lagwatch_replica_sync_state", "1 for the replica's sync_state in pg_stat_replication (async, "
                   "potential, sync, quorum), 0 for the others", C, R, "state")
SYNC_INFO = _spec(Info, "lagwatch_sync", "synchronous_standby_names and synchronous_commit on the primary", C,
                  "standby_names", "synchronous_commit", "method", "error", as_of=True)


def markdown() -> str:
    """docs/metrics.md: every family, by section, as this list has it."""
    out = ["# Metrics", "",
           "Every family lagwatch exports, generated from `daemon/lagwatch/render/families.py` and the rooms' "
           "(`daemon/lagwatch/rooms/`: `python3 -m lagwatch.serve.export > docs/metrics.md`). Each is declared "
           "(`# HELP`, `# TYPE`) on every scrape, whatever its series (in the text formats; protobuf leaves "
           "out a family with no series). A counter's samples end in `_total`, an info's in `_info`; a "
           "histogram has `_bucket`, `_count` and `_sum`, and in protobuf a native histogram beside them "
           "(a Prometheus with native histograms on keeps the native series under the family's own name: "
           "docs/http.md, \"/metrics formats\"); a summary `quantile` samples, `_count` and `_sum`.",
           ""]
    for section, specs in groupby(CATALOGUE.values(), key=lambda spec: spec.section):
        out += [f"## {section}", "", "| name | type | labels | what |", "|---|---|---|---|"]
        for spec in specs:
            labels = ", ".join(f"`{label}`" for label in spec.labels)
            out.append(f"| `{spec.series}` | {spec.kind} | {labels} | {spec.help.replace('|', chr(92) + '|')} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit("run: PYTHONPATH=daemon python3 -m lagwatch.serve.export > docs/metrics.md (with the rooms' families)")
