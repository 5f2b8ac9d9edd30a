"""What a replica's startup process (the one that replays) has read of relation data, from
``pg_stat_io`` (16+): with its busy ratio (views/recovery.py), whether replay is bound by
reading pages (replayload.py takes the rate over the window).

``pg_stat_io`` builds every backend type's rows from a statistics snapshot: ~150 µs of the
replica's CPU a read (bench/replicacost.py), more than the rest of the poll. The reads are a
rate over the window, so they are read on one poll in ``SLOW_EVERY`` (views/base.py), and
not carried over between: a rate needs the instant each count was read.

Read with pg_read_all_stats (the recovery view's grant; without it replay is not read).
"""

from __future__ import annotations

from collections.abc import Sequence

from lagwatch.views.base import SLOW_EVERY, Row, View, opt_int
from lagwatch.views.probe import Capabilities

QUERIES = {
    160000: """SELECT sum(reads)::int8 AS startup_reads FROM pg_stat_io
WHERE backend_type = 'startup' AND object = 'relation'""",
}


def parse(rows: Sequence[Row]) -> int | None:
    """Blocks the startup process has read since the statistics were reset."""
    return opt_int(rows[0].get("startup_reads")) if rows else None


def applies(caps: Capabilities) -> bool:
    return caps.major >= 16 and caps.can_read_all_stats


VIEW = View("startup_io", frozenset({"replica"}), QUERIES, parse, applies=applies, every=SLOW_EVERY, keep=False)
