"""Synchronous replication as the primary sees it: whether commits can complete.

``parse_standby_names`` reads ``synchronous_standby_names`` with PostgreSQL's own grammar
(src/backend/replication/syncrep_gram.y and syncrep_scanner.l):

- ``FIRST n (a, b, ...)`` and ``n (a, b, ...)``: priority; the first ``n`` standbys of the
  list that are connected and streaming are synchronous;
- ``ANY n (a, b, ...)``: quorum; any ``n`` of the listed standbys;
- ``a, b, ...`` (the legacy list): ``FIRST 1 (a, b, ...)``;
- names are identifiers, numbers or double-quoted strings (``""`` is a quote); ``*``
  matches any standby; names match ``application_name`` case-insensitively; ``ANY`` and
  ``FIRST`` are keywords in any case (a standby so named must be quoted).

``assess`` is pure: the parsed setting, ``synchronous_commit`` and the walsenders in,
a ``SyncReplication`` out. Hand-written because no maintained Python library parses this
setting; the grammar is eleven lines and the unit tests follow PostgreSQL's documentation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from lagwatch.fastinit import fast_init
from lagwatch.views.replication import WalSender

Method = Literal["priority", "quorum"]

# synchronous_commit levels that wait for standbys, and the stage each one waits for.
WAITED_STAGE = {"remote_write": "write", "on": "flush", "remote_apply": "replay"}
SYNC_COMMIT_ALIASES = {"true": "on", "yes": "on", "1": "on", "false": "off", "no": "off", "0": "off"}


class StandbyNamesError(ValueError):
    """The setting does not parse (PostgreSQL would have refused it too)."""


@dataclass(frozen=True)
class StandbyNames:
    method: Method
    num_sync: int
    names: tuple[str, ...]  # in the setting's order ("*" for any)

    def priority(self, application_name: str) -> int | None:
        """1 for the first listed name matching, 2 for the second...; None if unlisted."""
        folded = application_name.casefold()
        return next((i for i, n in enumerate(self.names, 1) if n == "*" or n.casefold() == folded), None)


_TOKEN = re.compile(r"""\s*(?:(?P<quoted>"(?:[^"]|"")*")|(?P<num>[0-9]+)
                        |(?P<ident>[A-Za-z\x80-\uffff_][A-Za-z\x80-\uffff_0-9$]*)|(?P<punct>[*,()])|(?P<bad>\S))""",
                    re.VERBOSE)


def _tokens(text: str) -> list[tuple[str, str]]:
    out = []
    position = 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:  # only trailing space is left
            break
        position = match.end()
        kind = match.lastgroup or "bad"
        value = match.group(kind)
        if kind == "bad":
            if value == '"':
                raise StandbyNamesError("unterminated quoted identifier")
            raise StandbyNamesError(f"syntax error at {value!r}")
        if kind == "quoted":
            out.append(("name", value[1:-1].replace('""', '"')))
        elif kind == "ident" and value.upper() in ("ANY", "FIRST"):
            out.append((value.upper(), value))
        elif kind == "punct":
            out.append((value, value) if value != "*" else ("name", "*"))
        else:
            out.append(("name" if kind == "ident" else "num", value))
    return out


def parse_standby_names(text: str) -> StandbyNames | None:
    """The setting, or None when it is empty (no synchronous replication)."""
    tokens = _tokens(text)
    if not tokens:
        return None
    method: Method = "priority"
    num = 1
    if tokens[0][0] in ("ANY", "FIRST") or (tokens[0][0] == "num" and len(tokens) > 1 and tokens[1][0] == "("):
        if tokens[0][0] in ("ANY", "FIRST"):
            method = "quorum" if tokens[0][0] == "ANY" else "priority"
            tokens = tokens[1:]
            if not tokens or tokens[0][0] != "num":
                raise StandbyNamesError("a number of standbys must follow ANY or FIRST")
        num = int(tokens[0][1])
        if len(tokens) < 2 or tokens[1][0] != "(" or tokens[-1][0] != ")":
            raise StandbyNamesError("the standby list must be in parentheses after the number")
        tokens = tokens[2:-1]
        if num <= 0:
            raise StandbyNamesError(f"number of synchronous standbys ({num}) must be greater than zero")
    names: list[str] = []
    expect_name = True
    for kind, value in tokens:
        if expect_name and kind in ("name", "num"):
            names.append(value)
        elif not expect_name and kind == ",":
            pass
        else:
            raise StandbyNamesError(f"syntax error at {value!r}")
        expect_name = not expect_name
    if expect_name:
        raise StandbyNamesError("the standby list ends without a name")
    return StandbyNames(method, num, tuple(names))


def normalize_sync_commit(value: str) -> str:
    value = value.strip().lower()
    return SYNC_COMMIT_ALIASES.get(value, value)


@fast_init
@dataclass(frozen=True)
class SyncReplication:
    """One cycle's view of synchronous replication on the primary."""

    standby_names: str  # the setting as read
    synchronous_commit: str  # normalised: off, local, remote_write, on, remote_apply
    method: Method | None  # None: no synchronous standbys configured
    required: int  # standbys a commit waits for (0 when none)
    healthy: int  # listed standbys connected and streaming
    states: dict[str, str]  # application_name -> async | potential | sync | quorum (PostgreSQL's word)
    at_risk: bool  # fewer healthy than required while commits wait on standbys: commits stall
    commit_wait_seconds: float | None  # the lag of the stage commits wait for, as they wait for it
    error: str | None = None  # the setting did not parse

    @property
    def waits_on_standbys(self) -> bool:
        return self.required > 0 and self.synchronous_commit in WAITED_STAGE

    @property
    def spare(self) -> int:
        """Healthy standbys beyond those required: 0 means one more loss stalls commits."""
        return self.healthy - self.required


def assess(standby_names: str, synchronous_commit: str, senders: Sequence[WalSender],
           apply_delays: Mapping[str, float] | None = None) -> SyncReplication:
    """``apply_delays``: each standby's recovery_min_apply_delay by application_name."""
    level = normalize_sync_commit(synchronous_commit)
    states = {s.application_name: s.sync_state or "async" for s in senders}
    try:
        parsed = parse_standby_names(standby_names)
    except StandbyNamesError as exc:
        return SyncReplication(standby_names, level, None, 0, 0, states, False, None, str(exc))
    if parsed is None:
        return SyncReplication(standby_names, level, None, 0, 0, states, False, None)
    # PostgreSQL's candidates: listed walsenders that stream (a catching-up one is not yet).
    healthy = [s for s in senders if s.state == "streaming" and parsed.priority(s.application_name) is not None]
    waiting = level in WAITED_STAGE
    at_risk = waiting and len(healthy) < parsed.num_sync
    wait = _commit_wait(parsed, healthy, WAITED_STAGE.get(level), apply_delays or {}) if waiting else None
    return SyncReplication(standby_names, level, parsed.method, parsed.num_sync, len(healthy), states,
                           at_risk, wait)


def stage_wait(sender: WalSender, stage: str, apply_delay: float = 0.0) -> float | None:
    """How long a commit waits for ``sender`` to reach ``stage``: PostgreSQL's own lag for
    the stage, except that a replay is never sooner than recovery_min_apply_delay after the
    WAL arrived. PostgreSQL's replay_lag interpolates between its samples and, under such a
    delay, shows mostly the undelayed part (measured on PostgreSQL 15: 0.1 ms while every
    remote_apply commit waited 50 ms), so the delay is added to the write lag here."""
    lag = sender.lag_seconds(stage)
    if stage != "replay" or apply_delay <= 0:
        return lag
    write = sender.lag_seconds("write") or 0.0
    return max(lag or 0.0, apply_delay + write)


def _commit_wait(parsed: StandbyNames, healthy: Sequence[WalSender], stage: str | None,
                 apply_delays: Mapping[str, float]) -> float | None:
    """What a commit waits for now: with priority, the slowest of the ``num_sync`` standbys
    of highest priority; with a quorum, the ``num_sync``-th fastest of all. None when too
    few are healthy (the wait has no end) or a lag is unknown."""
    if stage is None or len(healthy) < parsed.num_sync:
        return None

    def wait(s: WalSender) -> float | None:
        return stage_wait(s, stage, apply_delays.get(s.application_name, 0.0))

    if parsed.method == "priority":
        ranked = sorted(healthy, key=lambda s: parsed.priority(s.application_name) or 0)[:parsed.num_sync]
        lags = [wait(s) for s in ranked]
        known = [lag for lag in lags if lag is not None]
        return max(known) if len(known) == len(lags) else None
    fastest = sorted(lag for s in healthy if (lag := wait(s)) is not None)
    return fastest[parsed.num_sync - 1] if len(fastest) >= parsed.num_sync else None
