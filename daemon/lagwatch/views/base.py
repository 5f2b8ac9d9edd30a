"""What every view module provides: SQL by minimum server version, a pure parser, and when
the view is read: on which roles, on which servers, and how often."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

if TYPE_CHECKING:
    from lagwatch.views.probe import Capabilities

Row = Mapping[str, Any]
Role = Literal["primary", "replica"]
T = TypeVar("T")


def always(caps: Capabilities) -> bool:
    return True


@dataclass(frozen=True)
class View(Generic[T]):
    """One PostgreSQL view (or function) lagwatch reads.

    ``queries`` maps a minimum ``server_version_num`` to the SQL for servers from that
    version on; ``parse`` turns the rows into an immutable value and does no I/O.

    ``applies`` says, from what the connection's probe learnt once (version, role,
    privileges), whether the server has anything for the view to read: where it does not,
    the view costs the poll nothing, not even a clause. ``every``: the view is read on one
    poll in ``every`` on each connection (the first, then every ``every``-th), for what
    changes slowly or costs the server a row per session (the reader keeps the cadence,
    viewreader.py); ``keep``: between its reads the poll carries the value read last (a
    rate over samples wants None there instead: it needs the instant each was read). What
    is kept goes with the node's answer: a poll that fails, or a new connection, drops it.

    ``needs``: what the probe must have found true (a room's grants, by name) for the view
    to be read at all, where without it the SQL would fail outright; a server it applies to
    but that lacks one is said once, with the grant (rooms.missing_grants).

    ``queries_for``: where the SQL depends on what the probe learnt (a grant a room asked
    once per connection), the queries for those capabilities; the SQL is then chosen once
    per connection instead of the server asking the question again every poll.
    """

    name: str
    roles: frozenset[Role]
    queries: Mapping[int, str]
    parse: Callable[[Sequence[Row]], T]
    applies: Callable[[Capabilities], bool] = always
    every: int = 1
    keep: bool = True
    queries_for: Callable[[Capabilities], Mapping[int, str]] | None = None
    needs: tuple[str, ...] = ()

    def readable(self, caps: Capabilities) -> bool:
        """Whether a connection reads it: it applies, and the probe found what it needs."""
        return self.applies(caps) and all(caps.asked.get(name) is True for name in self.needs)

    def sql_for(self, server_version_num: int) -> str | None:
        """The SQL for a server of this version (``queries``)."""
        return _by_version(self.queries, server_version_num)

    def sql(self, caps: Capabilities) -> str | None:
        """The SQL for this connection: by its version, and by what its probe learnt."""
        if self.queries_for is None:
            return _by_version(self.queries, caps.version_num)
        return _by_version(self.queries_for(caps), caps.version_num)

    def due(self, poll: int) -> bool:
        """Whether the connection's ``poll``-th poll (0: its first) reads this view."""
        return poll % self.every == 0


def _by_version(queries: Mapping[int, str], server_version_num: int) -> str | None:
    usable = [v for v in queries if v <= server_version_num]
    return queries[max(usable)] if usable else None


# How often the views that build a row per session, or change slowly, are read (rooms/
# horizon.py, subscriptions.py, slotsync.py; views/startup_io.py): one cadence, so that on the
# polls that read none of them the statement is the same, and each connection prepares two.
SLOW_EVERY = 10


def opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
