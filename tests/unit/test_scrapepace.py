"""Each scraper's pace, and the soonest scrape due of them all (serve/scrapepace.py)."""

from __future__ import annotations

import pytest
from lagwatch.render import formats
from lagwatch.serve.scrapepace import SCRAPERS, PublishPace, ScrapeRhythm, Scrapers, scraper_of


def test_the_scrape_rhythm_says_when_the_next_scrape_is_due() -> None:
    rhythm = ScrapeRhythm()
    for at in (100.0, 115.0):
        rhythm.scraped(at)
    assert rhythm.expected(129.5) is None  # two scrapes: no pace yet
    rhythm.scraped(130.2)  # Prometheus' own jitter
    assert rhythm.expected(144.5) == pytest.approx(145.4)  # the upper median gap (15.2 s) after the last
    assert rhythm.expected(150.0) == pytest.approx(145.4)  # a little late is still expected
    assert rhythm.expected(160.0) is None  # half a period late: scrapes stopped


# Scrapes on a 15 s grid (0, 15, 30...), where the next is expected.
@pytest.mark.parametrize(("scrapes", "due"), [
    pytest.param([0.0, 15.0, 30.0, 45.0, 60.0], 75.0, id="on the grid"),
    pytest.param([0.0, 15.01, 29.98, 45.02, 60.0], 75.0, id="on the grid, a scraper's jitter"),
    # The bench's case: one scrape 2.4 s late; the last scrape plus a period put the next
    # at 77.4 and the one after at 92.4, both rendered when asked.
    pytest.param([0.0, 15.0, 30.0, 45.0, 62.4], 75.0, id="the last one 2.4 s late"),
    pytest.param([0.0, 15.0, 30.0, 47.4, 60.0], 75.0, id="the one before 2.4 s late"),
    pytest.param([0.0, 15.0, 30.0, 45.0, 58.0], 75.0, id="the last one 2 s early"),
    # Polls every 0.2 s (a bench waiting for a fleet to converge), then Prometheus's pace:
    # the median gap is its pace once two of the last four gaps are.
    pytest.param([-0.4, -0.2, 0.0, 15.0, 30.0], 45.0, id="polls, then three on the grid"),
    # The scraper's grid moved (7 s later: the target's labels changed, say): its first
    # scrape there is taken for one off the old grid; from its second the new grid is followed.
    pytest.param([0.0, 15.0, 30.0, 45.0, 67.0], 75.0, id="a new grid, its first scrape"),
    pytest.param([0.0, 15.0, 30.0, 45.0, 67.0, 82.0], 97.0, id="a new grid, its second scrape"),
])
def test_the_next_scrape_is_expected_on_the_scrapers_grid(scrapes: list[float], due: float) -> None:
    rhythm = ScrapeRhythm()
    for at in scrapes:
        rhythm.scraped(at)
    assert rhythm.expected(scrapes[-1] + 1.0) == pytest.approx(due, abs=0.05)


def test_an_ha_pairs_two_phases_are_two_paces_and_the_sooner_is_due_first() -> None:
    """Two Prometheus servers scraping every 15 s, 5 s apart: taken together their scrapes
    make gaps of 5 and 10 s (a pace of neither); kept apart, each is due 15 s after its
    last, and the next due is the sooner of the two, in its own format."""
    scrapers = Scrapers()
    for at in (100.0, 115.0, 130.0):
        scrapers.scraped("10.0.0.1", at, formats.PROTOBUF, True)
        scrapers.scraped("10.0.0.2", at + 5.0, formats.OPENMETRICS, False)
    due = scrapers.next_due(131.0)
    assert due is not None
    assert (due.at, due.scraper, due.period, due.format, due.gzip) == (145.0, "10.0.0.1", 15.0, formats.PROTOBUF, True)
    scrapers.scraped("10.0.0.1", 145.0, formats.PROTOBUF, True)
    due = scrapers.next_due(146.0)
    assert due is not None and (due.at, due.scraper, due.format) == (150.0, "10.0.0.2", formats.OPENMETRICS)


def test_a_scraper_without_a_pace_yet_is_not_due_and_old_scrapers_are_let_go() -> None:
    scrapers = Scrapers()
    scrapers.scraped("curl", 10.0)
    assert scrapers.next_due(11.0) is None
    for n in range(SCRAPERS + 3):
        for at in (0.0, 1.0, 2.0):
            scrapers.scraped(f"host{n}", at + n)
    assert len(scrapers._by_host) == SCRAPERS
    assert "curl" not in scrapers._by_host and "host0" not in scrapers._by_host


@pytest.mark.parametrize(("peer", "scraper"), [
    ("10.1.2.3:51234", "10.1.2.3"), ("[::1]:8080", "[::1]"), ("unix", "unix"),
])
def test_a_scraper_is_its_host_whatever_port_it_comes_from(peer: str, scraper: str) -> None:
    assert scraper_of(peer) == scraper


@pytest.mark.parametrize(("interval", "published", "within"), [
    (1.0, [], 1.0),  # nothing known yet: the interval
    (1.0, [0.0, 1.0, 2.0], 1.0),  # cycles that fit
    (1.0, [0.0, 1.5, 3.0, 6.0, 7.5], 3.0),  # overloaded, one cycle skipped: the longest gap
    (1.0, [0.0, 20.0, 21.0], 3.0),  # a stall: three intervals at most
    (2.0, [0.0, 0.9, 1.8], 2.0),  # gaps under the interval (a reload's first cycles): the interval
])
def test_the_next_publish_is_expected_within_the_longest_recent_gap(
        interval: float, published: list[float], within: float) -> None:
    pace = PublishPace()
    for at in published:
        pace.published(at, interval)
    assert pace.next_within(interval) == within


def test_gaps_under_another_interval_are_forgotten() -> None:
    pace = PublishPace()
    for at in (0.0, 10.0, 20.0):
        pace.published(at, 10.0)
    pace.published(21.0, 1.0)  # reloaded
    pace.published(22.0, 1.0)
    assert pace.next_within(1.0) == 1.0
