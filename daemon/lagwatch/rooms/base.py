"""What a room is: one thing lagwatch reads from PostgreSQL, with everything about it.

A room holds its view (SQL per major, parser, roles, the servers it applies to, how often:
views/base.py), what it asks once per connection (its probe columns) and the privileges it
needs (so the probe, ``check --grants`` and the role SQL learn them from it), its
families (in the catalogue, families.py), how a cluster's readings become one value across
cycles (its keeper: pure, the time passed in), and that value's samples, its part of
``/api/status`` and its line on ``/status``. The daemon's pipeline iterates over the rooms
(lagwatch.rooms.ROOMS): adding one is its module, its test, and one line there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from lagwatch.config.options import ClusterOptions
from lagwatch.render.families import Spec
from lagwatch.views.base import View

if TYPE_CHECKING:  # the slots' room names Cycle and Room in turn
    from lagwatch.rooms.slots import Slot

R = TypeVar("R")  # what the view reads on one node, as its parser types it
S = TypeVar("S")  # what the room says of a cluster
R_in = TypeVar("R_in", contravariant=True)
S_out = TypeVar("S_out", covariant=True)


def _undated(xid: int) -> float | None:
    return None


@dataclass(frozen=True)
class Cycle:
    """What a keeper may know of its cluster this cycle besides its own view's readings: the
    tracker's (estimate/tracker.py) view of the cluster, so that a room whose value combines
    with the lag core's (the slots' share of pg_wal, who holds the vacuum horizon) is still
    one room. Pure data; the time is passed in."""

    now: float  # the cycle's end, lagwatch's monotonic clock
    options: ClusterOptions  # the cluster's options as now in force (a reload may change them)
    primary: str | None = None  # the node that leads (None: no node answered as one)
    slots: tuple[Slot, ...] = ()  # the primary's replication slots this cycle (none: it did not answer)
    # How long ago the primary's transaction ID clock passed a (32-bit) transaction ID, at
    # least, in seconds (estimate/xidclock.py); None: not dated (older than lagwatch's history,
    # or no primary answered).
    xid_age: Callable[[int], float | None] = _undated
    # The limited slots' runways (estimate/rates.py's forecast: seconds until safe_wal_size
    # is 0; +Inf when it does not shrink), by slot.
    slot_runways: Mapping[str, float] = field(default_factory=dict)

    def leading(self, readings: Mapping[str, R]) -> R | None:
        """The leading primary's reading (None: no node leads, or it read nothing of it)."""
        return readings.get(self.primary) if self.primary is not None else None


class Keeper(Protocol[R_in, S_out]):
    """One cluster's room across cycles (the tracker keeps one per cluster)."""

    def update(self, readings: Mapping[str, R_in], cycle: Cycle) -> S_out | None:
        """This cycle's value from the readings of the nodes that answered with the view
        read or carried (by node name); None: nothing to say."""

    def forget(self, node: str) -> None:
        """A node gone from the cluster: nothing of it is kept."""


class KeepsNothing:
    """A keeper whose value is this cycle's alone (the server's counters are cumulative, the
    poll carries a slow view between its reads, the rest comes with the cycle)."""

    def forget(self, node: str) -> None:
        pass  # nothing kept: a node gone has no reading next cycle


class ByNode(KeepsNothing, Generic[R]):
    """This cycle's readings by node, in node order; None when no node answered with the view."""

    def update(self, readings: Mapping[str, R], cycle: Cycle) -> Mapping[str, R] | None:
        return dict(sorted(readings.items())) or None


@dataclass(frozen=True)
class Grant:
    """A privilege a room needs: asked in the probe, said by ``check --grants``, given by
    deploy/sql/lagwatch-role.sql."""

    name: str  # what check --grants calls it
    held: str  # an SQL boolean: the login role has it (asked once per connection)
    statement: str  # the statement that gives it, to ROLE
    # What it lets the room read (said when it is missing); "": the room's view. A room's grant
    # is never optional: the role SQL gives it, and an alert or a panel reads what it gives
    # (the archiver reads its counts without its grant, but LagwatchArchiveBehind needs the
    # segments waiting), so `check --grants` says MISSING, and what is not read without it.
    reads: str = ""


@dataclass(frozen=True)
class Room(Generic[R, S]):
    view: View[R]
    families: tuple[Spec[Any], ...]
    keeper: Callable[[], Keeper[R, S]]
    export: Callable[[str, S], None]  # the cluster's name and value -> samples (exposition.collecting)
    status: Callable[[S | None], Any]  # JSON-ready, for /api/status (None: nothing read)
    page: Callable[[S | None], str]  # the HTML of its /status line ('' for none)
    probe: Mapping[str, str] = field(default_factory=dict)  # column -> SQL asked once per connection
    grants: tuple[Grant, ...] = ()

    @property
    def name(self) -> str:
        return self.view.name
