"""Lagwatch's log read as its cycles: how many cycles of the product passed between two
things, for the pool tests' timing checks (counted in cycles, never in seconds of a
shared host's clock).

Each cycle of a lagwatch watching one cluster logs one INFO line (cyclelog.py), after
every line its pool control logged in that cycle (a pool change, an apply, a leadership
change): a line belongs to the cycle of the next cycle line, and the n-th cycle line is
cycle n (``lagwatch_cycles_total`` then reads n), but for cycles while the nodes were
connecting, which log no cycle line (a cluster is not read until its nodes answer): the
line "every node has answered or failed once ... (cycle N)" says which cycle the first
cycle line is (on a busy host the first cycle ended before the connections: a count from
the first line was one short of lagwatch_cycles_total). The cycle line gives each replica's
staleness as the pool policy judged it, with the condition it was flagged with.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lagwatch.durations import parse_duration

_ANSWERED = re.compile(r" INFO lagwatch\.daemon: every node has answered or failed once, .* \(cycle (?P<n>\d+)\)$")
_CYCLE = re.compile(r" INFO lagwatch\.daemon: (?P<cluster>[^:\s]+): (?P<body>.*)$")
_REPLICA = re.compile(r"(?P<name>[\w.-]+)=(?P<lag>\S+) \(p95 [^)]*\)(?: (?P<flag>[A-Z-]+))?")
_CHANGE = re.compile(r"pool change[^:]*: cluster=(?P<cluster>\S+) replica=(?P<member>\S+) action=(?P<action>\S+) "
                     r"reason=(?P<reason>.*) staleness=")
# Flags that make a cycle a bad one whatever the staleness (policy.py's _problem).
_PROBLEMS = {"DOWN", "NOT-STREAMING", "LAG-UNKNOWN"}

# A verdict on one cycle's reading: True, False, or None when the logged figure is too
# close to the threshold to tell (it is rounded: format_duration).
Verdict = bool | None


@dataclass(frozen=True)
class Reading:
    staleness: float | None  # None: "?"
    precision: float  # half the last digit of the logged figure
    flag: str


@dataclass
class Cycle:
    number: int
    line: str
    replicas: dict[str, Reading] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)  # what else was logged in this cycle


def _precision(text: str) -> float:
    digits = text.rstrip("msh")
    unit = parse_duration("1" + text[len(digits):])
    decimals = len(digits.split(".", 1)[1]) if "." in digits else 0
    return 0.5 * unit * 10.0 ** -decimals


class CycleLog:
    def __init__(self, text: str, cluster: str = "main", late_answers: float | None = None) -> None:
        """``late_answers``: ``lagwatch_late_answers_total`` when ``text`` was read (None:
        unknown), which bounds the cycles carried over (each has at least one)."""
        self.late_answers = late_answers
        self.cycles: list[Cycle] = []
        pending: list[str] = []
        skipped = 0  # cycles before the first cycle line (connecting)
        for line in text.splitlines():
            answered = _ANSWERED.search(line)
            if answered is not None and not self.cycles:
                skipped = int(answered.group("n")) - 1
            found = _CYCLE.search(line)
            if found is None or found.group("cluster") != cluster or "=" not in found.group("body"):
                pending.append(line)
                continue
            if not self.cycles:
                self.cycles = [Cycle(n, "") for n in range(1, skipped + 1)]  # logged no line
            cycle = Cycle(len(self.cycles) + 1, found.group("body").split("; down:")[0], lines=pending)
            for r in _REPLICA.finditer(cycle.line):
                lag = r.group("lag")
                cycle.replicas[r.group("name")] = Reading(None if lag == "?" else parse_duration(lag),
                                                          0.0 if lag == "?" else _precision(lag), r.group("flag") or "")
            self.cycles.append(cycle)
            pending = []
        self.unfinished = pending  # logged in the cycle under way (or after the last)

    def cycle_of(self, text: str, after: int = 0, count: int = 1) -> int:
        """The cycle in which ``text`` was logged for the ``count``-th time after cycle ``after``."""
        seen = 0
        for cycle in self.cycles[after:]:
            seen += sum(text in line for line in cycle.lines)
            if seen >= count:
                return cycle.number
        raise AssertionError(f"{text!r} not logged {count} time(s) in a cycle after cycle {after} "
                             f"(of {len(self.cycles)})")

    def change(self, member: str, action: str, after: int = 0) -> tuple[int, str]:
        """The cycle and reason of the first pool change ``action`` of ``member`` after cycle ``after``."""
        for cycle in self.cycles[after:]:
            for line in cycle.lines:
                found = _CHANGE.search(line)
                if found and found.group("member") == member and found.group("action") == action:
                    return cycle.number, found.group("reason")
        raise AssertionError(f"no {action} of {member} after cycle {after} in {len(self.cycles)} cycles")

    @classmethod
    def of(cls, lw: Any) -> CycleLog:
        """A running lagwatch's log so far (a ``harness.Lagwatch``), with its late answers."""
        late = lw.daemon_value("lagwatch_late_answers_total")
        return cls(lw.log_text(), late_answers=late)

    def fresh(self, first: int, last: int) -> int:
        """At least how many of cycles ``first``..``last`` were tracked afresh from their
        answers: a cycle that got some answers too late carries the cluster over as the
        last cycle left it (evidence.py), making no pool decision, and logs that cycle's
        line again. So no more were carried than lines repeated, nor than late answers."""
        total = last - first + 1
        repeated = sum(1 for n in range(max(first, 2), last + 1) if self.cycles[n - 1].line == self.cycles[n - 2].line)
        late = total if self.late_answers is None else int(self.late_answers)
        return total - min(repeated, late)

    def assert_acted_after_streak(self, member: str, action: str, after: int,
                                  judge: Callable[[Reading], Verdict], streak: int, late: int = 1) -> int:
        """The first ``action`` on ``member`` after cycle ``after`` came on the cycle that
        completed a run of ``streak`` cycles judged alike (``judge``), not sooner and not
        later: the policy's hysteresis (eject_after, readmit_after) counted in the
        product's own cycles. Returns the cycle it came in.

        Not sooner: the run of cycles the reading allows to be in the streak (a rounded
        figure too close to call counts in) holds at least ``streak`` cycles. Not later:
        the run of cycles surely in the streak holds no more than ``streak`` fresh ones,
        plus ``late`` cycles that may have decided nothing because this instance's leader
        lock round trip came back after the cycle stopped waiting (leader.py: its
        clusters make no pool decision that cycle), which a busy host makes happen."""
        acted, reason = self.change(member, action, after)
        assert f"for {streak} cycle(s)" in reason, (action, reason)

        def verdict(n: int) -> Verdict:
            reading = self.cycles[n - 1].replicas.get(member)
            return None if reading is None else judge(reading)

        earliest = acted
        while earliest - 1 > after and verdict(earliest - 1) is not False:
            earliest -= 1
        surely = acted
        while surely - 1 > after and verdict(surely - 1) is True:
            surely -= 1
        shown = self.excerpt(member, earliest - 1, acted)
        assert acted - earliest + 1 >= streak, f"{action} of {member} in cycle {acted} after fewer than " \
            f"{streak} cycles in a row that call for it:\n{shown}"
        assert self.fresh(surely, acted) <= streak + late, f"{action} of {member} in cycle {acted}, later " \
            f"than {streak} cycles in a row that call for it (+{late}):\n{shown}"
        return acted

    def excerpt(self, member: str, first: int, last: int) -> str:
        return "\n".join(f"cycle {c.number}: {c.line}" for c in self.cycles[max(0, first - 3):last + 2]
                         if member in c.replicas)


def above(threshold: float) -> Callable[[Reading], Verdict]:
    """A member's bad cycle (policy.py's _judge_member): staleness over ``threshold`` (max_lag),
    unknown, or the node down or not streaming."""
    def judge(r: Reading) -> Verdict:
        if r.flag in _PROBLEMS or r.staleness is None:
            return True
        if math.isclose(r.staleness, threshold, abs_tol=r.precision):
            return None
        return r.staleness > threshold
    return judge


def below(threshold: float) -> Callable[[Reading], Verdict]:
    """An outsider's good cycle (policy.py's _judge_outsider): reachable, streaming, staleness
    known and under ``threshold`` (readmit_below)."""
    def judge(r: Reading) -> Verdict:
        if r.flag in _PROBLEMS or r.staleness is None:
            return False
        if math.isclose(r.staleness, threshold, abs_tol=r.precision):
            return None
        return r.staleness < threshold
    return judge
