"""Logical consumers in time: each logical slot on the primary and whoever streams from it
(a subscription's apply worker, a change-data-capture client such as pg_recvlogical or
Debezium), measured like a replica and kept apart from the replicas: never a read
replica, never in a pool, series of their own (``lagwatch_logical_…``).

A consumer's staleness is the age of the oldest change on the primary it has not
confirmed: the first commit past its position (the furthest of what its walsender says it
applied and confirmed, the slot's ``confirmed_flush_lsn``, and where it was seen before:
``_position``), dated by the commit time the WAL gives where lagwatch may
read it (lsnclock.date_from_wal, as for a replica), else by the LSN clock (which dates bytes:
a transaction still running past the position reads as old as its first byte).

What a consumer confirms is a position in the whole WAL, not in its publication: a
walsender that has decoded everything pings its consumer, which confirms the ping's
position when it has nothing of its own left to flush. Writes outside the publication
therefore read as 0 within a ping's round trip, not as lag. Until then, and while a
subscriber with ``synchronous_commit = off`` (a subscription's default) has applied
transactions its own WAL has not flushed yet (``wal_writer_delay``), its position stays
at the end of the last transaction it applied, and commits written after that (published
or not) read as lag: with published commits every few milliseconds that is a few
milliseconds; with few of them and many others, up to the subscriber's flush delay.

Pure: the tracker passes each cycle's slots, walsenders and dates in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lagwatch.estimate.dating import Dated, date, gather
from lagwatch.estimate.lsnclock import LsnClock, WalDates
from lagwatch.estimate.snapshot import LogicalConsumer
from lagwatch.estimate.windows import LagWindow, window_samples
from lagwatch.rooms.slots import Slot
from lagwatch.views.replication import LogicalSender, logical_key


class LogicalConsumers:
    """One cluster's logical consumers across cycles: who was last seen on each slot, and a
    window of each one's staleness. Slots that go are forgotten with them."""

    def __init__(self, interval: float, window: float) -> None:
        self.window = window
        self._samples = window_samples(window, interval)
        self._names: dict[str, str] = {}  # slot -> the last application_name seen streaming from it
        self._done: dict[str, int] = {}  # slot -> the furthest position its consumer was seen at
        self._windows: dict[str, LagWindow] = {}

    def update(self, slots: Sequence[Slot], senders: Sequence[LogicalSender], primary_lsn: int | None,
               clock: LsnClock, wal_dates: Mapping[str, WalDates], at: float, now: float) -> tuple[
            LogicalConsumer, ...]:
        """This cycle's consumers: one per logical slot, and one per logical walsender whose
        slot the slots view did not show (read apart, a moment earlier). ``at``: when the
        primary's answer was asked for (the walsenders' positions are as of then)."""
        by_slot = {s.slot_name: s for s in senders}
        logical_slots = {s.name: s for s in slots if s.slot_type == "logical"}
        consumers = tuple(self._consumer(name, by_slot.get(name), logical_slots.get(name), primary_lsn, clock,
                                         wal_dates.get(logical_key(name)), at, now)
                          for name in sorted(set(logical_slots) | set(by_slot)))
        present = {c.slot for c in consumers}
        for gone in [n for n in self._windows if n not in present]:
            del self._windows[gone]
            self._names.pop(gone, None)
            self._done.pop(gone, None)
        return consumers

    def _consumer(self, name: str, sender: LogicalSender | None, slot: Slot | None, primary_lsn: int | None,
                  clock: LsnClock, dates: WalDates | None, at: float, now: float) -> LogicalConsumer:
        if sender is not None and sender.application_name:
            self._names[name] = sender.application_name
        position = _position(sender, slot, self._done.get(name))
        if position is not None:
            self._done[name] = position
        reading = _reading(position, clock, dates, at)
        window = self._windows.setdefault(name, LagWindow(self.window, self._samples))
        if reading is not None:
            window.add(at, reading.seconds)
        return LogicalConsumer(
            slot=name, consumer=self._names.get(name, name), active=sender is not None,
            state=sender.state if sender is not None else None,
            database=slot.database if slot else None, plugin=slot.plugin if slot else None, position=position,
            lag_bytes=max(0, primary_lsn - position) if primary_lsn is not None and position is not None else None,
            staleness=reading.seconds if reading is not None else None,
            evidence=reading.evidence if reading is not None else None,
            staleness_at=at if reading is not None else None, window=window.stats(now))



def _position(sender: LogicalSender | None, slot: Slot | None, seen: int | None) -> int | None:
    """How far the consumer is: the furthest of its walsender's word, the slot's
    confirmed_flush_lsn and where it was seen before. A subscriber applies before its own
    WAL flush lets it confirm, and what it applied is visible there: disabled (no
    walsender) it is not as far behind as its slot says, and enabled again it is sent
    from the slot's position anew, skipping what it has (its replication origin), before
    its replies catch up with what it had applied."""
    known = [p for p in (sender.position if sender is not None else None,
                         slot.confirmed_flush_lsn if slot is not None else None, seen) if p is not None]
    return max(known) if known else None


def _reading(position: int | None, clock: LsnClock, dates: WalDates | None, at: float) -> Dated | None:
    """Dated as a replica is (estimate/dating.py), from what is known of a consumer: the
    WAL past its position and the LSN clock (no commit timestamps, no heartbeat)."""
    if position is None:
        return None
    dated = date(gather(clock, position, at, wal=dates), standing=False)
    return dated if isinstance(dated, Dated) else None
