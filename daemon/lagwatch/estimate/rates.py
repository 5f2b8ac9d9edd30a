"""Rates and forecasts from a short history of byte positions: pure, the clock passed in.

A ``Progress`` keeps (time, bytes) samples of one counter that only moves forward (a
replica's replay LSN, the primary's current LSN, WAL a slot retains) over a horizon, and
gives its rate. ``catch_up`` and ``runway`` turn rates into the answers on call needs: will
this replica catch up, and when; how long until this slot loses its WAL.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from lagwatch.fastinit import fast_init
from lagwatch.rooms.slots import Slot


class Progress:
    """Samples of one position over the last ``horizon`` seconds (at least two kept)."""

    def __init__(self, horizon: float) -> None:
        self.horizon = horizon
        # Two arrays of doubles, not a deque of tuples: 16 bytes a sample instead of ~100
        # (a fleet of 300 clusters keeps ~1,500 of these, a minute of samples each).
        # Positions are byte counts; a double holds them exactly up to 2**53 (8 PiB).
        # Samples before _head are past the horizon; the arrays are replaced (never cut in
        # place) once those are half of them, so each is copied O(1) times on average.
        self._times = array("d")
        self._values = array("d")
        self._head = 0
        # Samples are counted as they come: ``_first`` is the number of the sample at
        # _head, and ``_stall`` that of the last sample that did not move past the one
        # before it, so rate_since_stall needs no walk over the horizon every cycle.
        self._first = 0
        self._stall: int | None = None

    def __len__(self) -> int:
        return len(self._times) - self._head

    def add(self, at: float, value: float) -> None:
        if len(self) and value < self._values[-1] - 0.5:
            self.clear()  # went back: another server or timeline, the history means nothing
        number = self._first + len(self)
        if len(self) and value <= self._values[-1]:
            self._stall = number
        times = self._times
        times.append(at)
        self._values.append(value)
        head = self._head
        while len(times) - head > 2 and at - times[head + 1] >= self.horizon:
            head += 1
        if head != self._head:
            self._first += head - self._head
            self._head = head
            if 2 * head >= len(times):
                self._times, self._values, self._head = times[head:], self._values[head:], 0

    def clear(self) -> None:
        self._first += len(self)
        self._times, self._values, self._head = array("d"), array("d"), 0
        self._stall = None

    def rate(self) -> float | None:
        """Bytes per second over the horizon (None with less than two samples)."""
        if len(self) < 2:
            return None
        return self._rate_from(self._head)

    def rate_since_stall(self) -> float | None:
        """The rate since the position last stood still (within the horizon): after a
        pause, how fast it moves now, not averaged with the time it did not."""
        count = len(self)
        # A stall at the oldest sample or before (dropped) leaves the whole horizon in motion.
        start = max(0, self._stall - self._first) if self._stall is not None else 0
        if count - start < 2:
            return 0.0 if count >= 2 else None
        if count - start >= 3:
            start += 1  # it began to move at some moment after the last sample that stood still
        return self._rate_from(self._head + start)

    def _rate_from(self, index: int) -> float | None:
        t0, t1 = self._times[index], self._times[-1]
        return (self._values[-1] - self._values[index]) / (t1 - t0) if t1 > t0 else None


@fast_init
@dataclass(frozen=True)
class CatchUp:
    backlog_bytes: int  # WAL the primary wrote that the replica has not replayed
    replay_rate: float | None  # bytes/s the replica replays now
    generation_rate: float | None  # bytes/s the primary writes
    eta_seconds: float | None  # backlog / (replay - generation); +inf when not catching up; None unknown

    @property
    def falling_behind(self) -> bool:
        return self.eta_seconds is not None and math.isinf(self.eta_seconds)


# Below this backlog a replica is caught up: the WAL of a few commits, not a trend.
CAUGHT_UP_BYTES = 64 * 1024


def catch_up(backlog: int, replay_rate: float | None, generation_rate: float | None,
             within: float = 0.0) -> CatchUp:
    """When the replica will have replayed everything, at the current rates. A replica
    less than ``within`` seconds of WAL behind is caught up: under steady writes a caught-up
    replica replays exactly as fast as the primary writes, so dividing what one poll finds
    in flight by a gain of ~0 would read as never catching up."""
    if backlog <= max(CAUGHT_UP_BYTES, (generation_rate or 0.0) * within):
        return CatchUp(backlog, replay_rate, generation_rate, 0.0)
    if replay_rate is None or generation_rate is None:
        return CatchUp(backlog, replay_rate, generation_rate, None)
    gaining = replay_rate - generation_rate
    eta = backlog / gaining if gaining > 0 else math.inf
    return CatchUp(backlog, replay_rate, generation_rate, eta)


def runway(safe_wal_size: float, retained_growth: float | None) -> float | None:
    """Seconds until a slot's safe_wal_size reaches 0: it shrinks as fast as the WAL the
    slot retains grows (the primary writes, the consumer does not confirm). +inf when it
    does not shrink; None before a rate is known."""
    if retained_growth is None:
        return None
    if safe_wal_size <= 0:
        return 0.0
    return safe_wal_size / retained_growth if retained_growth > 0 else math.inf


def _bytes_per_second(rate: float) -> str:
    for unit, size in (("GB/s", 1 << 30), ("MB/s", 1 << 20), ("kB/s", 1 << 10)):
        if rate >= size:
            return f"{rate / size:.1f} {unit}"
    return f"{rate:.0f} B/s"


def describe(c: CatchUp) -> str:
    """The words on call reads: "caught up", "catching up, ~40 s", "falling behind, 2.0 MB/s"."""
    if c.eta_seconds == 0.0:
        return "caught up"
    if c.eta_seconds is None:
        return "behind, rate not known yet"
    if math.isinf(c.eta_seconds):
        net = (c.generation_rate or 0.0) - (c.replay_rate or 0.0)
        return f"falling behind, {_bytes_per_second(net)}" if net > 0 else "not catching up"
    eta = c.eta_seconds
    return f"catching up, ~{eta:.0f} s" if eta < 120 else f"catching up, ~{eta / 60:.0f} min"


class Forecaster:
    """One cluster's rates and what they forecast: the primary's WAL generation, each
    replica's replay (catch-up ETAs) and each slot's release of WAL (runways), over the
    forecast horizon. Pure: positions and times in, forecasts out."""

    def __init__(self, horizon: float) -> None:
        self.horizon = horizon
        self._generation = Progress(horizon)  # the primary's current LSN
        self._replayed: dict[str, Progress] = {}  # replica -> its replay LSN
        self._slot_restart: dict[str, Progress] = {}  # slot -> current LSN minus what it retains

    def generation_rate(self) -> float | None:
        return self._generation.rate()

    def note_primary(self, at: float, lsn: int) -> None:
        self._generation.add(at, lsn)

    def catch_up(self, replica: str, replay_lsn: int, replay_at: float, primary_lsn: int,
                 within: float) -> CatchUp:
        """A replica's replay rate, backlog and catch-up ETA: the rate since replay last
        stood still (after a pause, how fast it replays now), against the primary's WAL
        generation rate, both over the forecast horizon."""
        progress = self._replayed.setdefault(replica, Progress(self.horizon))
        progress.add(replay_at, replay_lsn)
        return catch_up(max(0, primary_lsn - replay_lsn), progress.rate_since_stall(), self._generation.rate(),
                        within=within)

    def runways(self, slots: Iterable[Slot], primary_lsn: int | None, at: float) -> dict[str, float]:
        """Seconds until each limited slot's safe_wal_size reaches 0 at the current net rate
        (WAL written minus WAL the consumer lets go); +inf when it does not shrink."""
        out: dict[str, float] = {}
        present = set()
        for slot in slots:
            present.add(slot.name)
            if primary_lsn is None or slot.retained_bytes is None:
                continue
            progress = self._slot_restart.setdefault(slot.name, Progress(self.horizon))
            progress.add(at, primary_lsn - slot.retained_bytes)
            generation, released = self._generation.rate(), progress.rate()
            if slot.safe_wal_size is None or generation is None or released is None:
                continue
            left = runway(slot.safe_wal_size, generation - released)
            if left is not None:
                out[slot.name] = left
        if primary_lsn is not None:  # a primary that did not answer this cycle dropped no slot
            for name in set(self._slot_restart) - present:
                del self._slot_restart[name]  # a dropped slot
        return out

    def forget(self, replica: str) -> None:
        """A replica gone from the cluster."""
        self._replayed.pop(replica, None)

    def reset(self) -> None:
        """Another server, or its WAL went back: rates over both would mean nothing."""
        self._generation.clear()
        self._replayed.clear()
        self._slot_restart.clear()
