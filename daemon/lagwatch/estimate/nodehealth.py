"""Each node's health across cycles: counters since start, and one log line of lagwatch's
own when a node goes down (with why) and when it is back (the library's own messages about
a lost connection say neither which node nor what it means)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from lagwatch.durations import format_duration
from lagwatch.estimate.roles import RoleView
from lagwatch.estimate.snapshot import NodeHealth, NodeObservation

log = logging.getLogger("lagwatch.nodes")


@dataclass
class _Counters:
    polls: int = 0
    connects: int = 0  # connection attempts, as the node's poller last counted them
    errors: dict[str, int] = field(default_factory=dict)
    up: bool | None = None  # as last said in the log (None: nothing said yet)
    down_since: float | None = None


class NodeHealthTracker:
    """The nodes of one cluster: ``health`` folds a node's observation into its NodeHealth."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self._counters: dict[str, _Counters] = {}

    def health(self, obs: NodeObservation, roles: RoleView) -> NodeHealth:
        counters = self._counters.setdefault(obs.node, _Counters())
        counters.polls += 1
        counters.connects = max(counters.connects, obs.connects_total)
        if obs.error_kind is not None:
            counters.errors[obs.error_kind] = counters.errors.get(obs.error_kind, 0) + 1
        self._say_state_change(obs, counters)
        caps = obs.capabilities
        return NodeHealth(
            name=obs.node,
            role=obs.role,
            up=obs.ok,
            version_num=caps.version_num if caps else None,
            poll_duration=obs.duration,
            polls_total=counters.polls,
            errors_total=dict(counters.errors),
            last_error=obs.error,
            skipped=caps.skipped if caps else {},
            views=dict(obs.views),
            view_errors_total=dict(obs.view_errors_total),
            observed_role=roles.role_of(obs),
            timeline=obs.timeline,
            connects_total=counters.connects,
        )

    def forget(self, node: str) -> None:
        """Drop what is counted of ``node`` (gone from the cluster: history.forget_vanished)."""
        self._counters.pop(node, None)

    def _say_state_change(self, obs: NodeObservation, counters: _Counters) -> None:
        if obs.ok == counters.up or (obs.ok and counters.up is None):
            counters.up = obs.ok
            return
        where = f"{self.cluster}/{obs.node}"
        if obs.ok:
            down_for = obs.observed_at - counters.down_since if counters.down_since is not None else None
            log.info("%s: up again%s", where, f" after {format_duration(down_for)} down" if down_for else "")
            counters.down_since = None
        else:
            log.warning("%s: down: %s (%s)", where, obs.error or "no answer", obs.error_kind)
            counters.down_since = obs.observed_at
        counters.up = obs.ok
