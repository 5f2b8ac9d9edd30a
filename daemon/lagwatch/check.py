"""`lagwatch check`: two polls one interval apart, a table, a Nagios exit code.

The lag is the daemon's own staleness reading. A replica already behind when the check
starts is behind its two-poll history; the reading is then floored by the walsender's
replay_lag (estimate/lsnclock.py's "walsender" evidence), as for a daemon that has just started.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TextIO

from lagwatch.config import Config, ReplicaSla
from lagwatch.durations import format_duration
from lagwatch.escape import escape_controls
from lagwatch.estimate.snapshot import CONDITION_TEXT, ReplicaState, Snapshot, replica_condition

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
STATE_NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
# How bad each state is when combining rows: CRITICAL outranks UNKNOWN outranks WARNING.
_SEVERITY = {OK: 0, WARNING: 1, UNKNOWN: 2, CRITICAL: 3}


def worse(a: int, b: int) -> int:
    return a if _SEVERITY[a] >= _SEVERITY[b] else b


@dataclass(frozen=True)
class CheckRow:
    cluster: str
    replica: str
    state: int
    lag: float | None
    replay_bytes: int | None
    note: str
    cause: str = ""  # what holds its staleness back (diagnosis.py), "" before a reading


def evaluate(snapshot: Snapshot, warning: float, critical: float,
             expected: tuple[str, ...] = ()) -> tuple[int, list[CheckRow], list[str]]:
    """The check's verdict on ``snapshot``; ``expected``: the clusters it was to read (one
    not in the snapshot had a node still connecting, or an answer not taken in time)."""
    problems = _not_read(snapshot, expected)
    rows: list[CheckRow] = []
    for cluster in snapshot.clusters:
        primary = next((n for n in cluster.nodes if n.role == "primary"), None)
        if primary is None or not primary.up:
            problems.append((UNKNOWN, f"{cluster.name}: primary unreachable "
                                      f"({primary.last_error if primary else '?'})"))
        for r in cluster.replicas:
            row = _row(cluster.name, r, cluster.slas.get(r.name), warning, critical)
            rows.append(row)
            if row.state != OK:
                problems.append((row.state, f"{cluster.name}/{r.name}: {STATE_NAMES[row.state]} {row.note}".rstrip()))
    worst = OK
    for state, _ in problems:
        worst = worse(worst, state)
    return worst, rows, [text for _, text in problems]


def _not_read(snapshot: Snapshot, expected: tuple[str, ...]) -> list[tuple[int, str]]:
    """Clusters whose members or nodes could not be read: UNKNOWN, never OK by omission."""
    problems = [(UNKNOWN, f"{d.cluster}: member discovery failed: {d.error}")  # members unknown, or out of date
                for d in snapshot.discovery if not d.up]
    published = {c.name for c in snapshot.clusters}
    for name in expected:
        if name not in published:
            waiting = [n for c, n in snapshot.connecting if c == name]
            problems.append((UNKNOWN, f"{name}: not read: " + (f"still connecting to {', '.join(waiting)}" if waiting
                                                                else "an answer came too late to count")))
    return problems


def _row(cluster: str, r: ReplicaState, sla: ReplicaSla | None, warning: float, critical: float) -> CheckRow:
    ws = r.walsender
    if not r.configured:
        # Seen on the primary only: shown, not judged (the check is of what was asked for;
        # lagwatch cannot ask it whether it streams, nor whether it is meant to).
        return CheckRow(cluster, r.name, OK, r.staleness, ws.lag_bytes("replay") if ws else None,
                        "not in the config (seen on the primary)", _cause(r))
    condition = replica_condition(r, sla)
    state, note = OK, CONDITION_TEXT[condition]
    if condition == "down":
        state, note = CRITICAL, "unreachable"
    elif condition == "not_streaming":
        state, note = CRITICAL, f"not streaming ({r.wal_receiver_status or 'no WAL receiver'})"
    elif condition in ("unknown", "cannot_see"):
        state = UNKNOWN
    lag = r.staleness
    if lag is not None and lag >= critical:
        state = CRITICAL
    elif lag is not None and lag >= warning:
        state = worse(state, WARNING)
    if state != OK and r.diagnosis is not None and r.diagnosis.cause != "caught_up":
        note = f"{note}: {r.diagnosis.detail}"  # why, on the line the on-call engineer reads
    return CheckRow(cluster, r.name, state, lag, ws.lag_bytes("replay") if ws else None, note, _cause(r))


def _cause(r: ReplicaState) -> str:
    return r.diagnosis.cause if r.diagnosis is not None else ""


def render(rows: list[CheckRow]) -> str:
    header = ("CLUSTER", "REPLICA", "STATE", "LAG", "REPLAY BYTES", "CAUSE", "NOTE")
    # Each cell escaped (escape.py) before the columns are laid out: a name or a server's
    # message can start no line of the table, and the widths are those of what is shown.
    table = [header] + [tuple(escape_controls(cell) for cell in (
        r.cluster, r.replica, STATE_NAMES[r.state], "?" if r.lag is None else format_duration(r.lag),
        "?" if r.replay_bytes is None else str(r.replay_bytes), r.cause or "?", r.note)) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table)


def measuring_only(config: Config) -> Config:
    """``config`` without pool control or heartbeat: a check measures and reports; it must
    never take the leader lock from the running daemon, change a pooler, or write (a
    heartbeat would beat into the running daemon's own row)."""
    return config.model_copy(update={"clusters": tuple(c.model_copy(update={"pooler": None, "heartbeat": None})
                                                       for c in config.clusters)})


def run_check(config: Config, *, warning: float, critical: float, out: TextIO) -> int:
    from lagwatch.daemon import Daemon

    daemon = Daemon(measuring_only(config))
    daemon.sources.ask_every_cycle = False  # asked once below: a second ask would only delay the answer

    async def two_polls() -> Snapshot:
        try:
            await daemon.discover_now()  # Patroni's members, if any cluster is discovered
            await daemon.cycle()
            await asyncio.sleep(config.interval)
            return await daemon.cycle()
        finally:
            await daemon.close()

    snapshot = asyncio.run(two_polls())
    code, rows, problems = evaluate(snapshot, warning, critical,
                                    tuple(c.name for c in daemon.config.clusters_with_nodes))
    summary = "; ".join(problems) if problems else f"{len(rows)} replica(s) within {format_duration(warning)}"
    # One rule for every line a command prints (escape.py): what a server or Patroni said
    # can start no line of its own.
    print(escape_controls(f"LAGWATCH {STATE_NAMES[code]} - {summary}"), file=out)
    print(render(rows), file=out)
    return code
