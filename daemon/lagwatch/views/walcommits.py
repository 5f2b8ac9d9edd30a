"""The commits in stretches of the primary's WAL, from pg_walinspect: where each commit
record starts and the commit time it carries (on the primary's clock).

Read for the WAL just past each replica's replay position (commitscan.py says which
stretches): the first commit there is the oldest change a reader of that replica cannot
see yet, and its time dates the replica's staleness exactly, whatever the load.

pg_get_wal_records_info describes every record of its range (it cannot stop at the first
commit), and describing is what costs: ~60 MB/s of a big UPDATE's WAL on an idle core.
pg_get_wal_stats reads the same records ~8x as fast (~450-550 MB/s: it only counts them by
type), so where the role may call both (``locate_statement``) a range is first counted in
chunks, from its start, until one holds a commit, and only that chunk is described. A
range lists at most ``max_commits`` commits (plus one, to say where the listing stopped);
``scanned_to`` is where the next read of the same stretch starts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

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
# What a described range holds: where its last whole record ends, and its commits (the
# first ``@limit``) with their times. ``@range``: the range's bounds and any gate on them.
_DESCRIBED = f"""CROSS JOIN LATERAL (
                  SELECT max(w.end_lsn) AS scanned,
                         (array_agg(json_build_array(w.start_lsn::text, w.t) ORDER BY w.start_lsn)
                             FILTER (WHERE w.t IS NOT NULL))[1:@limit] AS commits
                  FROM (SELECT i.start_lsn, i.end_lsn,
                               CASE WHEN i.resource_manager = 'Transaction'
                                         AND i.record_type IN ('COMMIT', 'COMMIT_PREPARED')
                                         AND split_part(i.description, ';', 1) ~ {_COMMIT_TIME}
                                    THEN extract(epoch FROM split_part(i.description, ';', 1)::timestamptz)::float8
                               END AS t
                        FROM pg_get_wal_records_info@range) w) x"""

# Both statements' head: the reads, the primary's clock after them, and how long the
# server took (from the statement's arrival: lagwatch's own wait for the answer would count
# its host's delays as the reads' time, commitscan.CommitScanner._measured).
_HEAD = """SELECT q.reads, extract(epoch FROM clock_timestamp())::float8 AS clock_epoch,
       extract(epoch FROM clock_timestamp() - statement_timestamp())::float8 AS took"""

_SELECT = f"""{_HEAD}
FROM (SELECT coalesce((SELECT json_agg(json_build_array(r.s::text, x.scanned::text, x.commits, r.flush::text))
              FROM (SELECT u.s, least(u.e, f.flush) AS e, f.flush
                    FROM unnest(ARRAY[@starts]::pg_lsn[], ARRAY[@ends]::pg_lsn[]) AS u(s, e),
                         LATERAL (SELECT pg_current_wal_flush_lsn() AS flush) f
                    WHERE u.s < least(u.e, f.flush)) r
              {_DESCRIBED.replace("@range", "(r.s, r.e) i")}), '[]'::json) AS reads
      OFFSET 0) q"""


def statement(ranges: Sequence[tuple[int, int]], max_commits: int, timeout_ms: int) -> bytes:
    """The read of ``ranges`` (each from a record's start), every record described, with a
    statement timeout of its own (``SET LOCAL`` in the same simple query: one round trip,
    and the poll's own statements keep theirs): a read that would take too long is
    cancelled by the server and costs the poll nothing else. LSNs and numbers only, as
    literals (a simple query takes no parameters)."""
    starts = ",".join(f"'{format_lsn(a)}'" for a, _ in ranges)
    ends = ",".join(f"'{format_lsn(b)}'" for _, b in ranges)
    select = _SELECT.replace("@starts", starts).replace("@ends", ends).replace("@limit", str(int(max_commits) + 1))
    return _limited(select, timeout_ms)


def _limited(select: str, timeout_ms: int) -> bytes:
    return f"SET LOCAL statement_timeout = {max(1, int(timeout_ms))}; {select}".encode()


# Located reads (``locate_statement``). Chunks of CHUNK bytes, each starting STEP past the
# one before: they overlap by OVERLAP, so that a commit record up to that long is wholly
# inside one of them wherever it lies (pg_get_wal_stats counts only the records that begin
# at or after its start and end by its end). A longer one across a chunk's edge (a
# transaction with a thousand subtransactions) can be missed; the commit dated then is a
# later one, so the reading errs low, never high.
CHUNK = 16384
OVERLAP = 4096
STEP = CHUNK - OVERLAP
# Chunks end at least this far short of the primary's flush position: pg_walinspect fails
# the whole statement when no complete record begins at or after a read's start, as when
# the start lies inside the last record written. The WAL nearer the flush is read only
# from a record's start (a replica's position, or where a described read ended).
GUARD = 32768

# One range each: ``s`` where it starts; ``e`` how far its chunks may go; ``d`` how far a
# read from ``s`` describing every record may go (``s`` itself where it may not: ``s``
# is not known to be a record's start). Where the flush is within ``d``, or counting would
# go no further than describing (the flush within GUARD of ``d``), it is described from
# ``s`` up to ``d``, as ``statement`` does ("direct"); else its chunks are counted, from
# ``s``, until one holds a commit (LIMIT 1: those after it are not read), and that chunk
# is described ("located"); else the last chunk is described, for where its last record
# ends: the next read of the stretch starts there, at a record ("counted"). The filters on outer
# values alone (``c.a < c.b``, ``rr.a < rr.b``) gate the functions: they are not called
# on an empty range, which they reject.
_LOCATE = f"""{_HEAD}
FROM (SELECT coalesce((SELECT json_agg(json_build_array(r.s::text, x.scanned::text, x.commits, r.flush::text,
                                                        h.j, r.lim::text, r.direct))
              FROM (SELECT u.s, u.d, f.flush, l.lim, u.d > u.s AND (f.flush <= u.d OR l.lim <= u.d) AS direct
                    FROM unnest(ARRAY[@starts]::pg_lsn[], ARRAY[@ends]::pg_lsn[], ARRAY[@directs]::pg_lsn[])
                             AS u(s, e, d),
                         LATERAL (SELECT pg_current_wal_flush_lsn() AS flush) f,
                         LATERAL (SELECT least(u.e, f.flush - {GUARD}::numeric) AS lim) l
                    WHERE u.s < f.flush) r
              LEFT JOIN LATERAL (
                  SELECT g.j, c.a, c.b
                  FROM generate_series(0, @chunks - 1) g(j),
                       LATERAL (SELECT r.s + (g.j * {STEP})::numeric AS a,
                                       least(r.s + (g.j * {STEP} + {CHUNK})::numeric, r.lim) AS b) c,
                       LATERAL (SELECT sum(w.count) AS n FROM pg_get_wal_stats(c.a, c.b, true) w
                                WHERE c.a < c.b AND NOT r.direct
                                  AND w."resource_manager/record_type"
                                      IN ('Transaction/COMMIT', 'Transaction/COMMIT_PREPARED')) st
                  WHERE st.n > 0
                  LIMIT 1) h ON true
              CROSS JOIN LATERAL (
                  SELECT CASE WHEN r.direct THEN r.s WHEN h.j IS NOT NULL THEN h.a
                              ELSE greatest(r.s, r.lim - {CHUNK}::numeric) END AS a,
                         CASE WHEN r.direct THEN least(r.d, r.flush) WHEN h.j IS NOT NULL THEN h.b
                              ELSE r.lim END AS b) rr
              {_DESCRIBED.replace("@range", "(rr.a, rr.b) i WHERE rr.a < rr.b")}), '[]'::json) AS reads
      OFFSET 0) q"""


@dataclass(frozen=True)
class LocatedRange:
    start: int
    end: int  # how far its chunks may be counted
    direct_end: int  # how far it may be read whole from ``start`` (``start``: not a record's start)


def locate_statement(ranges: Sequence[LocatedRange], max_commits: int, timeout_ms: int) -> bytes:
    """The located read of ``ranges`` (see _LOCATE), with its own statement timeout."""
    chunks = max(1, max(-(-(r.end - r.start) // STEP) for r in ranges)) if ranges else 1
    select = (_LOCATE.replace("@starts", ",".join(f"'{format_lsn(r.start)}'" for r in ranges))
              .replace("@ends", ",".join(f"'{format_lsn(r.end)}'" for r in ranges))
              .replace("@directs", ",".join(f"'{format_lsn(r.direct_end)}'" for r in ranges))
              .replace("@chunks", str(chunks)).replace("@limit", str(int(max_commits) + 1)))
    return _limited(select, timeout_ms)


@dataclass(frozen=True)
class CommitRead:
    """One range read: from ``start``, up to ``scanned_to``, the commits in it."""

    start: int
    scanned_to: int  # == start: nothing whole was read (a record longer than the range)
    commits: tuple[tuple[int, float], ...]  # (start LSN of the commit record, commit time: epoch s)
    complete: bool  # read up to where the primary had flushed: every commit made before is here or earlier
    # Whether ``scanned_to`` is where a record starts (a described read's end). A counted
    # read ends OVERLAP short of its last chunk's end: every commit record beginning
    # before there (up to OVERLAP long) was counted, and none was.
    exact: bool = True
    counted_bytes: int = 0  # read by pg_get_wal_stats (counted, not described)
    described_bytes: int = 0  # read by pg_get_wal_records_info


@dataclass(frozen=True)
class WalCommits:
    """What the primary's WAL holds just past one replica's (or consumer's) replay position,
    as read: every commit in [start, end), each with the time it carries on the primary's
    own clock (estimate/clock.PrimaryClock puts them on lagwatch's)."""

    start: int
    end: int
    commits: tuple[tuple[int, float], ...]  # (start LSN of the commit record, its time: the primary's epoch seconds)
    # Read up to where the primary had flushed when it was read: no commit past the last
    # listed had been made by then.
    complete: bool


@dataclass(frozen=True)
class WalDatingTotals:
    """A primary's reads of commit times since lagwatch started."""

    read_bytes: int = 0  # WAL read, counted or described
    reads: int = 0  # statements run
    cancelled: int = 0  # cancelled by the server at their time budget
    failed: int = 0  # failed otherwise (their dates are the cycle before's)
    retried: int = 0  # run again without a range that held no whole record (CommitScanner._read)


_NO_RECORD_AFTER = re.compile(r"could not find a valid record after ([0-9A-Fa-f]+/[0-9A-Fa-f]+)")


def no_record_after(exc: Exception) -> int | None:
    """The start pg_walinspect found no whole record after, where that is why it failed."""
    match = _NO_RECORD_AFTER.search(str(exc))
    return parse_lsn(match.group(1)) if match else None


@dataclass(frozen=True)
class CommitReads:
    clock_epoch: float | None  # the primary's clock just after it read them (None: nothing was read)
    reads: tuple[CommitRead, ...]
    # Seconds the server spent from the statement's arrival to the reads' end (its clock,
    # not lagwatch's: a starved lagwatch takes its answer late, the server read no slower).
    took: float | None = None


def parse(rows: Sequence[Row], max_commits: int) -> CommitReads:
    (row,) = rows
    reads = []
    for start_text, scanned_text, commits_json, flush_text, *located in row["reads"] or ():
        start, flush = parse_lsn(start_text), parse_lsn(flush_text)
        assert start is not None and flush is not None
        scanned = parse_lsn(scanned_text) if scanned_text is not None else None
        commits = []
        for lsn_text, epoch in commits_json or ():
            lsn = parse_lsn(lsn_text)
            if lsn is not None:
                commits.append((lsn, float(epoch)))
        scanned_to = max(start, scanned or start)
        read = CommitRead(start, scanned_to, (), complete=scanned_to >= flush, described_bytes=scanned_to - start)
        if located:
            read = _located(read, located, flush)
        if len(commits) > max_commits:
            # The first commit not kept: the stretch from there is read again, later.
            read = replace(read, scanned_to=commits[max_commits][0], complete=False, exact=True)
            commits = commits[:max_commits]
        reads.append(replace(read, commits=tuple(commits)))
    took = row.get("took")
    return CommitReads(float(row["clock_epoch"]), tuple(reads), float(took) if took is not None else None)


def _located(read: CommitRead, located: list[Any], flush: int) -> CommitRead:
    """What a located read's row says (_LOCATE): read whole, a chunk described, or only counted."""
    chunk, limit_text, direct = located
    limit = parse_lsn(limit_text)
    assert limit is not None
    if direct:
        return read
    if chunk is not None:  # chunks 0..chunk counted, the last described
        first = read.start + int(chunk) * STEP
        counted = min(first + CHUNK, limit) - read.start
        return replace(read, complete=False, counted_bytes=counted, described_bytes=max(0, read.scanned_to - first))
    # Counted to ``limit``, no commit in it, and the last chunk described: the stretch
    # ends where its last record does. No record ended in it (one longer than a chunk):
    # known up to OVERLAP short of ``limit``, not at a record's start.
    counted = max(0, limit - read.start)
    last_chunk = max(read.start, limit - CHUNK)
    if read.scanned_to > last_chunk:
        return replace(read, complete=False, counted_bytes=counted, described_bytes=read.scanned_to - last_chunk)
    known = limit - OVERLAP
    if known <= read.start:
        return replace(read, complete=False, counted_bytes=counted, described_bytes=0)
    return CommitRead(read.start, known, (), complete=False, exact=False, counted_bytes=counted,
                      described_bytes=min(CHUNK, counted))
