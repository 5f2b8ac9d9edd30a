"""What a cycle publishes of each cluster when some of its answers are no evidence.

A cluster all of whose nodes answered (or failed) is tracked afresh. One with an answer
lagwatch got to too late, or a node still making its first connection (lateness.py), is
carried over as the last cycle published it (``carried_cycles``): no node of it reads
down, it makes no pool decision, no role changes. Before its first publication it is not
published at all, and its connecting nodes are listed instead. A start says so in two
lines, not a WARNING per node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from lagwatch.durations import format_duration
from lagwatch.estimate.snapshot import ClusterSnapshot, NodeObservation
from lagwatch.estimate.tracker import ClusterTracker

log = logging.getLogger("lagwatch.daemon")


class Evidence:
    def __init__(self) -> None:
        self.late_answers = 0  # answers got to too late to count, since start
        self._published: dict[str, ClusterSnapshot] = {}  # each cluster as the last cycle published it
        self._connecting_said = False  # the start's "still connecting" line
        self._started_at = time.monotonic()

    def track(self, tracker: ClusterTracker, observations: Sequence[NodeObservation], now: float,
              connecting: list[tuple[str, str]]) -> ClusterSnapshot | None:
        """The cluster as this cycle leaves it: tracked from its answers, or as the last
        cycle published it (None before its first publication), its nodes still connecting
        added to ``connecting``."""
        pending = [o for o in observations if o.pending is not None]
        if not pending:
            return tracker.update(observations, now)
        name = tracker.cluster.name
        self.late_answers += sum(1 for o in pending if o.pending == "late")
        connecting.extend((name, o.node) for o in pending if o.pending == "connecting")
        last = self._published.get(name)
        return None if last is None else replace(last, carried_cycles=last.carried_cycles + 1)

    def published(self, clusters: Sequence[ClusterSnapshot]) -> None:
        self._published = {c.name: c for c in clusters}

    def say_connecting(self, cycle: int, connecting: Sequence[tuple[str, str]], nodes: int) -> None:
        """At start, one line for the nodes still connecting and one when none is, not a
        WARNING per node: they are no evidence of anything yet. The second names its cycle:
        a cluster's first cycle line comes with it, later than the first cycle while its
        nodes were connecting, and a reader of the log counting cycle lines starts there."""
        if cycle == 1 and connecting:
            self._connecting_said = True
            log.info("first cycle: %d of %d node(s) answered; %d still connecting (read neither up nor down "
                     "until they answer or fail)", nodes - len(connecting), nodes, len(connecting))
        elif self._connecting_said and not connecting:
            self._connecting_said = False
            log.info("every node has answered or failed once, %s after start (cycle %d)",
                     format_duration(time.monotonic() - self._started_at), cycle)
