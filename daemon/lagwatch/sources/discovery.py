"""Keeping each discovered cluster's membership: asked every cycle, kept when unanswered.

Patroni unreachable (or answering nonsense) keeps the last known membership, so polling,
metrics and the pool go on as they were; the status says so (``lagwatch_discovery_up``
0, one WARNING when it starts and one INFO when it ends). A membership whose members
cannot make a valid cluster config is refused the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from pydantic import ValidationError

from lagwatch.config import ClusterConfig, Config, PatroniClusterConfig
from lagwatch.errors import validation_problems
from lagwatch.estimate.snapshot import DiscoveryStatus
from lagwatch.sources.patroni import DiscoveryError, Membership, cluster_config, fetch_membership

log = logging.getLogger("lagwatch.sources.discovery")


# How many membership-change lines a cluster may log in a burst, and how fast that allowance
# comes back: members joining and leaving, even through a failover and a maintenance window's
# restarts, are each said; a Patroni (or an etcd) that renames its members in every answer is
# said in summary, at most 6 lines a minute once the burst is spent (some 5 MB a day at the
# worst, where every name was logged every second before: 2.9 GB). A burst of 5 with a line a
# minute hid a member's join after a test's failover and leave.
CHANGE_LINES_BURST = 20
CHANGE_LINES_EVERY = 10.0  # seconds for one more line's allowance
NAMES_SHOWN = 8  # member names a line lists before "and N more"


class ChangeLines:
    """A token bucket for one cluster's membership-change lines: ``allow`` says whether to
    log one now, and how many changes went unsaid since the last one logged."""

    def __init__(self) -> None:
        self.tokens = float(CHANGE_LINES_BURST)
        self.at: float | None = None
        self.unsaid = 0

    def allow(self, now: float) -> tuple[bool, int]:
        if self.at is not None:
            self.tokens = min(CHANGE_LINES_BURST, self.tokens + (now - self.at) / CHANGE_LINES_EVERY)
        self.at = now
        if self.tokens < 1:
            self.unsaid += 1
            return False, 0
        self.tokens -= 1
        unsaid, self.unsaid = self.unsaid, 0
        return True, unsaid


def _names(names: set[str]) -> str:
    shown = sorted(names)
    more = len(shown) - NAMES_SHOWN
    return ", ".join(shown[:NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")


class _Known:
    def __init__(self, name: str) -> None:
        self.name = name
        self.membership: Membership | None = None
        self.config: ClusterConfig | None = None
        self.template: PatroniClusterConfig | None = None  # the cluster config ``config`` was made from
        self.up = False
        self.errors = 0
        self.last_success_at: float | None = None
        self.error: str | None = None
        self.said_down = False
        self.changes = ChangeLines()


class Discovery:
    def __init__(self) -> None:
        self._known: dict[str, _Known] = {}

    def cluster_configs(self, clusters: Sequence[PatroniClusterConfig]) -> list[ClusterConfig]:
        """The cluster configs of the memberships in force (none yet for a cluster never answered)."""
        out = []
        for cluster in clusters:
            known = self._known.get(cluster.name)
            if known is None or known.membership is None or known.config is None:
                continue
            # A reload may have changed the template: the members stay, their config follows.
            out.append(known.config if known.template == cluster else cluster_config(cluster, known.membership))
        return out

    def statuses(self, clusters: Sequence[PatroniClusterConfig]) -> tuple[DiscoveryStatus, ...]:
        out = []
        for cluster in clusters:
            k = self._known.get(cluster.name) or _Known(cluster.name)
            members = k.membership.members if k.membership else ()
            out.append(DiscoveryStatus(cluster.name, k.up, len(members), k.errors, k.last_success_at,
                                       k.membership.source if k.membership else None, k.error,
                                       tuple((m.name, m.role, m.state) for m in members)))
        return tuple(out)

    async def refresh(self, clusters: Sequence[PatroniClusterConfig], timeout: float, room: int | None = None) -> bool:
        """Ask every cluster's Patroni; True when a membership in force changed. ``room``:
        how many nodes the discovered clusters may have together (the daemon's max_nodes
        less its static nodes); a membership that would take them past it is refused, the
        last good one kept, as an answer that is no member list is."""
        for name in set(self._known) - {c.name for c in clusters}:
            del self._known[name]  # a cluster removed from the config by a reload
        fetched = await asyncio.gather(*(self._fetch(c, timeout) for c in clusters))
        used = sum(len(k.membership.members) for k in self._known.values() if k.membership is not None)
        changed = False
        for cluster, answer in zip(clusters, fetched, strict=True):
            known = self._known.setdefault(cluster.name, _Known(cluster.name))
            held = len(known.membership.members) if known.membership is not None else 0
            if isinstance(answer, Membership) and room is not None and used - held + len(answer.members) > room:
                answer = (f"{answer.source}: {len(answer.members)} members, more than the {max(0, room - used + held)}"
                          " nodes max_nodes leaves room for: refused")
            changed = self._take(cluster, known, answer) or changed
            used += (len(known.membership.members) if known.membership is not None else 0) - held
        return changed

    @staticmethod
    async def _fetch(cluster: PatroniClusterConfig, timeout: float) -> Membership | str:
        """The cluster's members, or why there are none."""
        per_url = cluster.discovery.timeout or min(2.0, timeout)
        try:
            return await asyncio.to_thread(fetch_membership, cluster.discovery, per_url)
        except DiscoveryError as exc:
            return str(exc)
        except Exception as exc:  # a case no rule foresaw: still only this cluster's discovery fails
            log.debug("%s: discovery failed unexpectedly", cluster.name, exc_info=True)
            return f"unexpected {type(exc).__name__}: {exc}"

    def _take(self, cluster: PatroniClusterConfig, known: _Known, answer: Membership | str) -> bool:
        if isinstance(answer, str):
            return self._failed(known, answer)
        membership = answer
        same = (known.membership is not None and known.config is not None and known.template == cluster
                and membership.addresses == known.membership.addresses)
        try:
            config = known.config if same and known.config is not None else cluster_config(cluster, membership)
        except ValidationError as exc:
            return self._failed(known, "the members make no valid cluster: " + "; ".join(validation_problems(exc)))
        except Exception as exc:  # as in _fetch: only this cluster's discovery fails
            log.debug("%s: discovery failed unexpectedly", cluster.name, exc_info=True)
            return self._failed(known, f"unexpected {type(exc).__name__}: {exc}")
        changed = known.config is not config
        if changed:
            before = {m.name for m in known.membership.members} if known.membership else set()
            after = {m.name for m in membership.members}
            say, unsaid = known.changes.allow(time.monotonic())
            if say:
                log.info("%s: members from %s: %s%s%s%s", cluster.name, membership.source, _names(after) or "none",
                         f"; joined: {_names(after - before)}" if before and after - before else "",
                         f"; left: {_names(before - after)}" if before - after else "",
                         f" ({unsaid} change(s) since the last such line not said one by one: members changing "
                         "this often are summarised)" if unsaid else "")
        if known.said_down:
            log.info("%s: Patroni answers again (%s)", cluster.name, membership.source)
        known.membership, known.config, known.template = membership, config, cluster
        known.up, known.error, known.said_down = True, None, False
        known.last_success_at = time.time()
        return changed

    def _failed(self, known: _Known, error: str) -> bool:
        known.up, known.error = False, error
        known.errors += 1
        if not known.said_down:
            kept = (f"keeping the last known {len(known.membership.members)} member(s)"
                    if known.membership is not None else "no members known yet")
            log.warning("%s: member discovery failed, %s: %s", known.name, kept, error)
            known.said_down = True
        return False


def room_for(config: Config) -> int:
    """How many nodes the discovered clusters may have together: max_nodes less the nodes
    the config and its cluster files name."""
    return config.max_nodes - sum(1 + len(c.replicas) for c in config.clusters_with_nodes)


def with_members_now(config: Config, timeout: float = 2.0) -> Config:
    """``config`` with each discovered cluster as its members make it, asked once now (for
    the one-shot commands); DiscoveryError when a cluster's Patroni does not answer."""
    clusters = list(config.clusters_with_nodes)
    for cluster in config.patroni_clusters:
        try:
            clusters.append(cluster_config(cluster, fetch_membership(cluster.discovery,
                                                                     cluster.discovery.timeout or timeout)))
        except DiscoveryError as exc:
            raise DiscoveryError(f"{cluster.name}: member discovery failed: {exc}") from None
        except ValidationError as exc:
            raise DiscoveryError(f"{cluster.name}: the members make no valid cluster: "
                                 + "; ".join(validation_problems(exc))) from None
    return config.model_copy(update={"clusters": tuple(clusters)})
