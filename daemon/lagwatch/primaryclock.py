"""The primary's wall clock read against lagwatch's monotonic clock: what turns a timestamp
the primary wrote (a replica's last replayed commit's) into lagwatch's time, without
comparing two hosts' clocks (lag.Commits takes them from there)."""

from __future__ import annotations

from dataclasses import dataclass

from lagwatch.fastinit import fast_init
from lagwatch.snapshot import NodeObservation


@fast_init
@dataclass(frozen=True)
class PrimaryClock:
    """The primary's wall clock read against our monotonic clock in one poll: turns a
    timestamp the primary wrote (a commit's) into our time, without comparing two hosts'
    clocks. Off by at most the poll's round trip."""

    observed_at: float
    epoch: float

    @classmethod
    def of(cls, primary: NodeObservation, standby: bool) -> PrimaryClock | None:
        """A standby cluster's commits were stamped by a primary lagwatch does not poll:
        their ages are read against the standby leader's last replayed commit, taken as of
        the moment it was asked (only differences between that primary's stamps, no two
        hosts' clocks). Measured this way a replica's commit lag behind the standby leader
        is short by at most the age of the standby leader's own last commit."""
        position = primary.position
        if position is None:
            return None
        if standby:
            epoch = position.last_replay_epoch
            return None if epoch is None else cls(primary.asked_at or primary.observed_at, epoch)
        read_at = primary.answered_at or primary.observed_at
        return None if position.clock_epoch is None else cls(read_at, position.clock_epoch)

    def monotonic(self, epoch: float) -> float:
        return self.observed_at - (self.epoch - epoch)


def last_commit_at(obs: NodeObservation | None, primary_clock: PrimaryClock | None) -> float | None:
    """When (our clock) the primary made the last commit this replica has replayed."""
    if obs is None or not obs.ok or obs.position is None or primary_clock is None:
        return None
    epoch = obs.position.last_replay_epoch
    return None if epoch is None else primary_clock.monotonic(epoch)
