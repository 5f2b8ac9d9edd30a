"""When the next /metrics scrape is due, scraper by scraper: the render ahead's clock.

Prometheus scrapes each target at a fixed interval, on a grid of its own, so a scraper's
next scrape comes a period (the median gap) after the grid point its last ones were on,
in the format and coding its last one took. An HA pair (two Prometheus servers scraping
the same targets, the usual way to run it) keeps one pace at two phases: taken together
their scrapes make gaps of no pace at all, so each scraper's is kept apart, by the host
it scrapes from, and the next scrape due is the soonest of theirs. And when the next
snapshot will have been published (``PublishPace``): a render ahead must be made in the
last cycle that publishes before its scrape. Pure: times are passed in.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Collection
from dataclasses import dataclass

from lagwatch.render import formats
from lagwatch.render.formats import Format

# Scrapers kept (the most recently seen): an HA pair, a federation, a developer's curl.
SCRAPERS = 8
# Gaps between publishes that judge how soon the next will come: an overloaded fleet skips
# a cycle in ten or so, and a gap that long must be among them.
PUBLISH_GAPS_KEPT = 20
# ...but no more than this many intervals, whatever a stall (a fleet's connect timeouts)
# made one gap: a render ahead further than that would be served too old.
PUBLISH_GAP_CAP = 3.0


# The scrapes the next one's place on the scraper's grid is taken from: their median is
# the grid while no more than one of them is off it.
PROJECTED_FROM = 3


def _period(at: list[float]) -> float:
    """The median gap between the scrapes ``at`` (0 while fewer than three)."""
    if len(at) < 3:
        return 0.0
    gaps = sorted(b - a for a, b in itertools.pairwise(at))
    return gaps[len(gaps) // 2]


class ScrapeRhythm:
    """One scraper's pace: when its next scrape is due, and the format and coding its last
    one took (the next will too)."""

    def __init__(self) -> None:
        self._at: deque[float] = deque(maxlen=5)
        self.format: Format = formats.TEXT
        self.gzip = False

    def scraped(self, at: float, fmt: Format = formats.TEXT, gzip: bool = False) -> None:
        self._at.append(at)
        self.format = fmt
        self.gzip = gzip

    def period(self) -> float:
        """The pace: the median gap between the last scrapes (0 while unknown)."""
        return _period(list(self._at))  # one step in C: scrapes append from the HTTP threads meanwhile

    def expected(self, now: float) -> float | None:
        """When the next scrape is expected (None while the pace is not known, and once an
        expected scrape is more than half a period late: scrapes stopped, or changed pace).

        Prometheus keeps each target on a grid (whole intervals of the clock, at an offset
        hashed from the target), so one scrape that came late or early (a scraper starved
        on its host, a retransmit) does not move the next: the next is the median of where
        the last PROJECTED_FROM scrapes put it, a period after the grid point nearest the
        last. (The last scrape plus a period followed a scrape 1.4-2.4 s late, in
        bench/fleet.py on an overloaded host, with the next two rendered when asked: the
        late one, then the one on time, early against it.) A scrape more than half a
        period off its grid is taken for the nearest grid point's. A scraper whose grid
        moves (its interval, the target's labels or its own external labels changed) is
        followed from its second scrape on the new grid."""
        at = list(self._at)
        period = _period(at)
        if not period:
            return None
        last = at[-1]
        projected = sorted(a + (round((last - a) / period) + 1) * period for a in at[-PROJECTED_FROM:])
        expected = projected[len(projected) // 2]
        return expected if now - period / 2 <= expected else None


@dataclass(frozen=True)
class Due:
    """The next scrape expected: when, from which scraper, at what pace, in what format."""

    at: float
    scraper: str
    period: float
    format: Format
    gzip: bool


class Scrapers:
    """Each scraper's rhythm, by the host it scrapes from (the most recent SCRAPERS)."""

    def __init__(self) -> None:
        self._by_host: OrderedDict[str, ScrapeRhythm] = OrderedDict()
        self._lock = threading.Lock()  # scrapes come on the HTTP server's threads, the cycle asks

    def scraped(self, scraper: str, at: float, fmt: Format = formats.TEXT, gzip: bool = False) -> None:
        with self._lock:
            rhythm = self._by_host.get(scraper)
            if rhythm is None:
                rhythm = self._by_host[scraper] = ScrapeRhythm()
                while len(self._by_host) > SCRAPERS:
                    self._by_host.popitem(last=False)
            else:
                self._by_host.move_to_end(scraper)
            rhythm.scraped(at, fmt, gzip)

    def next_due(self, now: float, besides: Collection[float] = (), late: float = float("inf")) -> Due | None:
        """The soonest scrape expected of any scraper whose pace is known, other than those
        due at ``besides`` (already rendered for) and those more than ``late`` overdue."""
        with self._lock:
            rhythms = list(self._by_host.items())
        soonest: Due | None = None
        for scraper, rhythm in rhythms:
            expected = rhythm.expected(now)
            if expected is None or expected in besides or expected < now - late:
                continue
            if soonest is None or expected < soonest.at:
                soonest = Due(expected, scraper, rhythm.period(), rhythm.format, rhythm.gzip)
        return soonest


class PublishPace:
    """How soon after a publish the next will have come, at the latest: an interval while
    cycles fit it; longer and uneven while they do not (a cycle that overruns makes the
    next wait, and lagwatch then keeps a longer interval: 300 x 3 on a loaded host
    published mostly 1.4-1.5 s apart and one gap in ten 2.7-3 s, where the interval alone,
    or the last five gaps, left a scrape between two cycles' horizons, rendered for by
    neither: it rendered for itself, 0.4-0.8 s). The longest of the last twenty gaps, at
    most three intervals; gaps kept under another interval (before a reload) are dropped."""

    def __init__(self) -> None:
        self._at: deque[float] = deque(maxlen=PUBLISH_GAPS_KEPT + 1)
        self._interval: float | None = None

    def published(self, at: float, interval: float) -> None:
        if interval != self._interval:
            self._at.clear()
            self._interval = interval
        self._at.append(at)

    def next_within(self, interval: float) -> float:
        gaps = [b - a for a, b in itertools.pairwise(self._at)]
        return min(max([interval, *gaps]), PUBLISH_GAP_CAP * interval)


def scraper_of(peer: str) -> str:
    """The host a request came from (its peer without the port): one scraper's scrapes come
    on new connections from new ports."""
    host, _, _ = peer.rpartition(":")
    return host or peer
