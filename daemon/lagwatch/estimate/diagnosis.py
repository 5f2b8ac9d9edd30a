"""Why a replica is behind: where its staleness sits, stage by stage, and what holds it.

The headline staleness (estimate/lsnclock.py) is the age of the oldest change the replica has not
replayed. The same change sits at one of four stages on its way, which the walsender's
positions and the replica's own separate:

    send     the primary has not sent it yet            current .. sent
    write    sent, not yet written by the replica       sent .. write
    flush    written, not yet flushed to its disk       write .. flush
    replay   on its disk, not yet replayed              flush .. replay

Each boundary is dated by the same LSN clock as the headline (``dated``: the age of the
first byte past a position) and held within the headline, so the four parts are never
negative and add up to it. A part is in bytes too.

The cause is the stage's reason, taken from what the replica's startup process is doing
(views/recovery.py) and its settings; the cause of the largest part wins, and every cause
that holds part of the lag is listed with its seconds. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

from lagwatch.durations import format_duration
from lagwatch.fastinit import fast_init
from lagwatch.views.recovery import Recovery

Cause = Literal["caught_up", "apply_delay", "replay_paused", "recovery_conflict", "replay_busy", "not_streaming",
                "network", "sender", "unknown"]
CAUSES: tuple[Cause, ...] = ("caught_up", "apply_delay", "replay_paused", "recovery_conflict", "replay_busy",
                             "not_streaming", "network", "sender", "unknown")
STAGES = ("send", "write", "flush", "replay")


@fast_init
@dataclass(frozen=True)
class Positions:
    """Where the replica's WAL stands, as the primary's walsender and the replica said."""

    current: int | None = None  # the primary's WAL position
    sent: int | None = None  # the walsender's
    write: int | None = None
    flush: int | None = None
    received: int | None = None  # the replica's own: received and flushed (pg_last_wal_receive_lsn)
    replay: int | None = None


@fast_init
@dataclass(frozen=True)
class Signals:
    """What the replica says about its replay and its WAL receiver."""

    recovery: Recovery | None = None  # its startup process (None: not read)
    pause_state: str | None = None  # pg_get_wal_replay_pause_state()
    apply_delay: float | None = None  # recovery_min_apply_delay, seconds
    streaming: bool | None = None  # its WAL receiver streams (None: cannot see)
    receiver_status: str | None = None
    last_msg_age: float | None = None  # seconds since its WAL receiver last heard from the primary
    replay_advanced: bool | None = None  # its replay moved since the last cycle
    walsender: bool = True  # the primary has a walsender for it (its row, if not its columns)
    answered: bool = True  # the replica answered its own poll this cycle


@fast_init
@dataclass(frozen=True)
class Diagnosis:
    cause: Cause
    detail: str  # one line for the page, the log and `lagwatch check`
    stage_seconds: tuple[float, ...]  # by STAGES; they add up to the staleness
    stage_bytes: tuple[int | None, ...]  # by STAGES; None where a boundary is unknown
    causes: tuple[tuple[Cause, float], ...]  # every cause holding part of it, largest first
    conflict: str | None = None  # the conflict type replay waits on (its sessions: Recovery.holders)


def diagnose(staleness: float, positions: Positions, dated: Callable[[int], float | None],
             signals: Signals) -> Diagnosis:
    """Where ``staleness`` sits and why. ``dated(lsn)``: the staleness of a replica at ``lsn``
    by the LSN clock, at the same instant as ``staleness`` (None: unknown)."""
    seconds, nbytes = split(staleness, positions, dated)
    recovery = signals.recovery
    causes: dict[Cause, float] = {}
    for stage, part in zip(STAGES, seconds, strict=True):
        if part > 0:
            holding = _stage_cause(stage, signals, part)
            causes[holding] = causes.get(holding, 0.0) + part
    ranked = tuple(sorted(causes.items(), key=lambda c: (-c[1], STAGES_BY_CAUSE.get(c[0], 0))))
    if staleness < CAUGHT_UP_BELOW or not ranked:
        cause: Cause = "caught_up"
    else:
        cause = ranked[0][0]
    conflict = recovery.conflict if recovery is not None and cause == "recovery_conflict" else None
    return Diagnosis(cause, describe(cause, signals), seconds, nbytes, ranked, conflict)


# Below this the replica is caught up whatever the stage a few milliseconds sit in: on a busy
# primary they move from send to write to replay every cycle, which says nothing.
CAUGHT_UP_BELOW = 0.010

# Where two causes hold the same time, the one nearer replay (the more specific) wins.
STAGES_BY_CAUSE: dict[Cause, int] = {"replay_paused": -4, "recovery_conflict": -4, "apply_delay": -4,
                                     "replay_busy": -4, "unknown": -4, "network": -2}


def split(staleness: float, positions: Positions,
          dated: Callable[[int], float | None]) -> tuple[tuple[float, ...], tuple[int | None, ...]]:
    """The staleness by stage, in seconds (adding up to it) and bytes."""
    p = positions
    # Nothing says it has more than it replayed (no walsender, no answer of its own): what it
    # lacks is not on its way, and counts as not sent.
    flushed = _latest(p.flush, p.received, p.replay if p.flush is None and p.received is None else None)
    written = _latest(p.write, flushed)
    sent = _latest(p.sent, written)
    # Each boundary's age, held within the headline and never younger than the one after
    # it (a position further on was written later): walking from the primary back to replay.
    ages: list[float] = []
    held = 0.0
    for lsn in (sent, written, flushed):
        age = dated(lsn) if lsn is not None else None
        held = min(staleness, max(held, age if age is not None else held))
        ages.append(held)
    parts = [ages[0], ages[1] - ages[0], ages[2] - ages[1], staleness - ages[2]]
    bounds = (p.current, sent, written, flushed, p.replay)
    nbytes = tuple(None if a is None or b is None else max(0, a - b) for a, b in pairwise(bounds))
    return tuple(max(0.0, part) for part in parts), nbytes


def _latest(*lsns: int | None) -> int | None:
    known = [lsn for lsn in lsns if lsn is not None]
    return max(known) if known else None


def _stage_cause(stage: str, s: Signals, part: float) -> Cause:
    if stage == "send":
        return "not_streaming" if s.streaming is False or not s.walsender else "sender"
    if stage in ("write", "flush"):
        return "network"
    return replay_cause(s, part)


def replay_cause(s: Signals, held: float) -> Cause:
    """Why what the replica has on disk (``held`` seconds of it) is not replayed yet."""
    activity = s.recovery.activity if s.recovery is not None else None
    if activity == "paused" or (s.pause_state is not None and s.pause_state != "not paused"):
        return "replay_paused"
    if activity == "conflict":
        return "recovery_conflict"
    # Under an apply delay the startup process sleeps until each commit is old enough, then
    # replays up to the next one: a sample that finds it elsewhere is still held by the
    # delay, unless replay lags much further behind than the delay explains.
    if activity == "delayed" or (s.apply_delay and activity is not None and held <= 1.5 * s.apply_delay + 0.05):
        return "apply_delay"
    if activity == "working":
        return "replay_busy"
    if activity == "waiting_for_wal":
        # Replay has caught up with what arrived: the part is WAL just landing.
        return "not_streaming" if s.streaming is False else "network"
    return "unknown"  # not seen (no answer, no pg_read_all_stats), or in a wait not known to be work


def describe(cause: Cause, s: Signals) -> str:
    """One line for a human: what holds the replica and where to look."""
    r = s.recovery
    if cause == "caught_up":
        return f"caught up: less than {format_duration(CAUGHT_UP_BELOW)} behind the primary"
    if cause == "apply_delay":
        return f"recovery_min_apply_delay holds replay {format_duration(s.apply_delay or 0.0)} behind"
    if cause == "replay_paused":
        return f"replay is paused ({s.pause_state or 'paused'}): pg_wal_replay_resume() on the replica"
    if cause == "recovery_conflict" and r is not None:
        return _conflict_line(r, archive=s.streaming is False)
    if cause == "replay_busy":
        on = r.working_on if r is not None else None
        return f"the startup process is busy replaying ({on or 'working'}): replay is at its limit"
    if cause == "not_streaming":
        return _not_streaming_line(s)
    if cause == "network":
        return "sent by the primary, not yet written and flushed by the replica (network or the replica's disk)"
    if cause == "sender":
        return "not yet sent by the primary's walsender"
    if not s.answered:
        return "the replica does not answer: where its lag sits and why is not known"
    if r is not None and r.activity == "other_wait":
        return f"the lag sits in replay; the startup process waits on {r.wait_event_type}/{r.wait_event}"
    return "the lag sits in replay; what holds it is not known (the startup process is hidden from this role)"


def _conflict_line(r: Recovery, archive: bool) -> str:
    kind = r.conflict or "unknown"
    who = ", ".join(f"pid {h.pid} ({h.user or '?'}, transaction open {format_duration(h.xact_age or 0.0)})"
                    for h in r.holders[:3]) or "no session seen"
    held = "held by" if r.holders and r.holders[0].exact else "sessions with a snapshot:"
    # WAL from the archive waits max_standby_archive_delay; both count from when it arrived.
    name, delay = ("max_standby_archive_delay", r.max_archive_delay) if archive else \
        ("max_standby_streaming_delay", r.max_streaming_delay)
    limit = "" if delay is None else (
        f"; {name} -1 (waits forever)" if delay < 0
        else f"; queries cancelled after {name} {format_duration(delay)} (counted from the WAL's arrival)")
    return f"replay waits on a {kind} conflict, {held} {who}{limit}"


def _not_streaming_line(s: Signals) -> str:
    if s.streaming is None:
        return "the WAL is not reaching the replica (its WAL receiver is hidden from this role)"
    if s.recovery is not None and s.recovery.restore_command_set:
        # With restore_command set, a replica that does not stream replays what the archive
        # holds: it catches up only as far as the archive goes, never to the primary.
        advancing = ", replay advancing" if s.replay_advanced else ""
        return (f"no WAL receiver: in archive recovery (restore_command{advancing}); check primary_conninfo, "
                "the slot, the primary's reachability")
    heard = "" if s.last_msg_age is None else f", last heard from the primary {format_duration(s.last_msg_age)} ago"
    status = s.receiver_status or "no WAL receiver"
    return f"not streaming ({status}{heard}): check primary_conninfo, the slot, the primary's reachability"
