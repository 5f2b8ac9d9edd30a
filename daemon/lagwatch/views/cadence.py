"""The one rule for views read one poll in N (views/base.py: ``every``, ``keep``): which of a
connection's views its next poll reads, and what the polls between carry.

Read every N polls on each connection (its first, then every N-th); between the reads, the
value read last (for a view that keeps one) and its health as of that read; nothing once
the node fails to answer or the connection is new (``forget``): what was read of a node is
carried only while it keeps answering. Pure: the poll's number, its results and failures in,
what the poll reports out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lagwatch.views.base import View


class Cadence:
    """One connection's cadenced views: their last values and whether their last read worked."""

    def __init__(self) -> None:
        self._kept: dict[str, Any] = {}  # view -> its last value (where it keeps one)
        self._last_ok: dict[str, bool] = {}  # view -> whether its last read worked
        # (id of the views that apply, which cadenced ones are due) -> (those views, the choice)
        self._chosen: dict[tuple[int, tuple[bool, ...]], tuple[tuple[View[Any], ...], tuple[View[Any], ...]]] = {}

    def forget(self) -> None:
        """The node did not answer, or the connection is new: nothing is carried past it."""
        self._kept.clear()
        self._last_ok.clear()

    def choose(self, applying: tuple[View[Any], ...], poll: int) -> tuple[View[Any], ...]:
        """The views of ``applying`` the connection's ``poll``-th poll (0: its first) reads:
        every one read each poll, the cadenced ones when due (the same tuple for the same
        choice: the combined statement is built and prepared once per choice)."""
        key = (id(applying), tuple(v.due(poll) for v in applying if v.every > 1))
        entry = self._chosen.get(key)
        if entry is None or entry[0] is not applying:  # (an id is reused once its tuple is gone)
            if len(self._chosen) > 64:  # a connection probes again after a failover: old choices go
                self._chosen.clear()
            entry = self._chosen[key] = (applying, tuple(v for v in applying if v.due(poll)))
        return entry[1]

    def carry(self, applying: Sequence[View[Any]], poll: int, results: dict[str, Any], failed: dict[str, str],
              health: dict[str, bool], resting: Callable[[str], bool]) -> None:
        """The cadenced views' values and health this poll, in ``results`` and ``health``: as
        read when due (then kept, where the view keeps one); as last read on the polls between."""
        for view in applying:
            if view.every <= 1:
                continue
            name = view.name
            if view.due(poll):
                self._last_ok[name] = name in results
                if name in results and view.keep:
                    self._kept[name] = results[name]
                else:
                    self._kept.pop(name, None)
            elif name not in failed and not resting(name) and name in self._last_ok:
                health[name] = self._last_ok[name]
                if name in self._kept:
                    results[name] = self._kept[name]
