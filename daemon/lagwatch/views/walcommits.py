"""The commits in stretches of the primary's WAL, from pg_walinspect's pg_get_wal_records_info:
where each commit record starts and the commit time it carries (on the primary's clock).

Read for the WAL just past each replica's replay position (commitscan.py says which
stretches): the first commit there is the oldest change a reader of that replica cannot
see yet, and its time dates the replica's staleness exactly, whatever the load.

pg_get_wal_records_info decodes every record of its range (it cannot stop at the first
commit), so each range is bounded by the caller. A range lists at most ``max_commits``
commits (plus one, to say where the listing stopped); ``scanned_to`` is where the next
read of the same stretch starts: the end of the last record read, or the start of the
first commit not listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagwatch.lsn import format_lsn, parse_lsn
from lagwatch.views.base import Row

FUNCTION = "pg_get_wal_records_info(pg_lsn,pg_lsn)"
GRANT = "GRANT EXECUTE ON FUNCTION pg_get_wal_records_info(pg_lsn, pg_lsn) TO ROLE (optional)"

# A commit record's description starts with its commit time, as timestamptz_to_str writes
# it ("2026-11-26 04:55:42.578162+00; ..."); anything else is left undated rather than
# failing the statement on a cast.
_COMMIT_TIME = r"'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?([+-]\d\d(:\d\d)?)?$'"

# Ranges with nothing to read (start at or past the flush) are left out before
# pg_get_wal_records_info sees them: PostgreSQL 15 rejects an empty range. Each range
# reports the flush position it was cut at, so that a read that reached it is known
# complete. The primary's clock is read after the reads (the subquery is not flattened,
# OFFSET 0): decoding takes milliseconds, and a clock read before them would date every
# commit late by that much.
_SELECT = f"""SELECT q.reads, extract(epoch FROM clock_timestamp())::float8 AS clock_epoch
FROM (SELECT coalesce((SELECT json_agg(json_build_array(r.s::text, x.scanned::text, x.commits, r.flush::text))
              FROM (SELECT u.s, least(u.e, f.flush) AS e, f.flush
                    FROM unnest(ARRAY[@starts]::pg_lsn[], ARRAY[@ends]::pg_lsn[]) AS u(s, e),
                         LATERAL (SELECT pg_current_wal_flush_lsn() AS flush) f
                    WHERE u.s < least(u.e, f.flush)) r
              CROSS JOIN LATERAL (
                  SELECT max(w.end_lsn) AS scanned,
                         (array_agg(json_build_array(w.start_lsn::text, w.t) ORDER BY w.start_lsn)
                             FILTER (WHERE w.t IS NOT NULL))[1:@limit] AS commits
                  FROM (SELECT i.start_lsn, i.end_lsn,
                               CASE WHEN i.resource_manager = 'Transaction'
                                         AND i.record_type IN ('COMMIT', 'COMMIT_PREPARED')
                                         AND split_part(i.description, ';', 1) ~ {_COMMIT_TIME}
                                    THEN extract(epoch FROM split_part(i.description, ';', 1)::timestamptz)::float8
                               END AS t
                        FROM pg_get_wal_records_info(r.s, r.e) i) w) x), '[]'::json) AS reads
      OFFSET 0) q"""


def statement(ranges: Sequence[tuple[int, int]], max_commits: int, timeout_ms: int) -> bytes:
    """The read of ``ranges``, with a statement timeout of its own (``SET LOCAL`` in the
    same simple query: one round trip, and the poll's own statements keep theirs): a read
    that would take too long is cancelled by the server and costs the poll nothing else.
    LSNs and numbers only, as literals (a simple query takes no parameters)."""
    starts = ",".join(f"'{format_lsn(a)}'" for a, _ in ranges)
    ends = ",".join(f"'{format_lsn(b)}'" for _, b in ranges)
    select = _SELECT.replace("@starts", starts).replace("@ends", ends).replace("@limit", str(int(max_commits) + 1))
    return f"SET LOCAL statement_timeout = {max(1, int(timeout_ms))}; {select}".encode()


@dataclass(frozen=True)
class CommitRead:
    """One range read: from ``start``, up to ``scanned_to``, the commits in it."""

    start: int
    scanned_to: int  # == start: nothing whole was read (a record longer than the range)
    commits: tuple[tuple[int, float], ...]  # (start LSN of the commit record, commit time: epoch s)
    complete: bool  # read up to where the primary had flushed: every commit made before is here or earlier


@dataclass(frozen=True)
class CommitReads:
    clock_epoch: float  # the primary's clock just after it read them
    reads: tuple[CommitRead, ...]


def parse(rows: Sequence[Row], max_commits: int) -> CommitReads:
    (row,) = rows
    reads = []
    for start_text, scanned_text, commits_json, flush_text in row["reads"] or ():
        start, flush = parse_lsn(start_text), parse_lsn(flush_text)
        assert start is not None and flush is not None
        scanned = parse_lsn(scanned_text) if scanned_text is not None else None
        commits = []
        for lsn_text, epoch in commits_json or ():
            lsn = parse_lsn(lsn_text)
            if lsn is not None:
                commits.append((lsn, float(epoch)))
        scanned_to = max(start, scanned or start)
        if len(commits) > max_commits:
            # The first commit not kept: the stretch from there is read again, later.
            scanned_to = commits[max_commits][0]
            commits = commits[:max_commits]
        reads.append(CommitRead(start, scanned_to, tuple(commits), complete=scanned_to >= flush))
    return CommitReads(float(row["clock_epoch"]), tuple(reads))
