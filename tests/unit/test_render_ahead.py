"""/metrics rendered once per snapshot: ahead of a scrape Prometheus's pace says is due,
before the snapshot is published, so a scrape in between never renders it a second time."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from lagwatch.config import Config, parse_config
from lagwatch.estimate.snapshot import Snapshot, SnapshotHolder
from lagwatch.render import formats
from lagwatch.render.formats import Format
from lagwatch.serve import web as web_module
from lagwatch.serve.negotiation import choose_format
from lagwatch.serve.web import WebServer

CONFIG = parse_config({"clusters": [{"name": "m", "primary": {"dsn": "host=a"}}]})


def snapshot(cycles: int) -> Snapshot:
    return Snapshot(taken_at=float(cycles), cycle_duration=0.01, cycles_total=cycles, overruns_total=0, clusters=())


def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each time a snapshot's families are built (what a render costs, whatever the format)."""
    renders: list[int] = []
    real = web_module.families
    monkeypatch.setattr(web_module, "families", lambda *a, **k: renders.append(1) or real(*a, **k))
    return renders


def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The web server's clock, standing still where the test sets ``clock[0]``."""
    clock = [time.monotonic()]
    monkeypatch.setattr(web_module.time, "monotonic", lambda: clock[0])
    return clock


def frozen_server(monkeypatch: pytest.MonkeyPatch,
                  config: Callable[[], Config] = lambda: CONFIG) -> tuple[SnapshotHolder, WebServer, list[float]]:
    """A web server (never started: metrics() is called directly), its snapshot holder, and
    its clock standing still (``frozen_clock``)."""
    holder = SnapshotHolder()
    return holder, WebServer("127.0.0.1", 0, holder, config), frozen_clock(monkeypatch)


def paced(web: WebServer, due: float, scraper: str = "", fmt: Format = formats.TEXT, gzip: bool = False) -> None:
    """Three scrapes 15 s apart from ``scraper``, the next due at ``due``."""
    for ago in (45.0, 30.0, 15.0):
        web._scrapes.scraped(scraper, due - ago, fmt, gzip)


def test_a_due_scrape_is_served_what_was_rendered_before_publishing(monkeypatch: pytest.MonkeyPatch) -> None:
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)  # never started: metrics() is called directly
    holder.publish(snapshot(1))
    now = time.monotonic()
    paced(web, now)  # a scrape every 15 s; the next is due now
    renders = counted(monkeypatch)

    between = []  # what a scrape gets after the render ahead, before the snapshot is published
    holder.on_publish.append(lambda s: between.append((holder.get(), web.metrics(None)[0])))
    holder.publish(snapshot(2))
    assert len(renders) == 1  # ahead, and only ahead
    (seen, body), = between
    assert seen is not None and seen.cycles_total == 1  # readers did not see snapshot 2 yet...
    assert b"lagwatch_cycles_total 2.0" in body  # ...but its text was ready and served
    assert b"lagwatch_cycles_total 2.0" in web.metrics(None)[0]
    assert len(renders) == 1
    # Said in lagwatch_http_metrics_renders/_served: one render, ahead; both scrapes served ready.
    assert (web.renders, web.served) == ({"ahead": 1, "asked": 0}, {"ready": 2, "waited": 0})
    assert b'lagwatch_http_metrics_renders_total{when="ahead"} 1.0' in web._render(holder.get()).body(formats.TEXT)


def test_nobody_scraping_renders_nothing_and_an_unexpected_scrape_renders_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)
    renders = counted(monkeypatch)
    for cycles in range(1, 5):
        holder.publish(snapshot(cycles))
    assert renders == []
    assert b"lagwatch_cycles_total 4.0" in web.metrics(None)[0]
    assert b"lagwatch_cycles_total 4.0" in web.metrics(None)[0]
    assert len(renders) == 1


def test_a_slow_render_of_an_older_snapshot_never_replaces_a_newer_one(monkeypatch: pytest.MonkeyPatch) -> None:
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)
    older, newer = snapshot(1), snapshot(2)
    web._render(newer)  # rendered ahead while a scrape was rendering the one before
    web._render(older)  # that scrape ends later
    holder.publish(newer)
    renders = counted(monkeypatch)
    assert b"lagwatch_cycles_total 2.0" in web.metrics(None)[0]
    assert renders == []  # served what was rendered ahead


def test_a_failing_hook_still_publishes() -> None:
    holder = SnapshotHolder()

    def broken(s: Snapshot) -> None:
        raise RuntimeError("a bug in a hook")

    holder.on_publish.append(broken)
    with pytest.raises(RuntimeError):
        holder.publish(snapshot(1))
    assert holder.get() is not None and holder.get().cycles_total == 1  # type: ignore[union-attr]


def test_gzip_when_asked_compressed_once_per_snapshot_and_ahead_when_the_scraper_takes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip

    from lagwatch.serve.httpmessages import Request

    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)
    holder.publish(snapshot(1))
    compressions = []
    real = gzip.compress
    monkeypatch.setattr(web_module.gzip, "compress", lambda *a, **k: compressions.append(1) or real(*a, **k))

    def scrape(**headers: str) -> tuple[int, bytes, dict[str, str]]:
        answer = web.handle(Request("GET", "/metrics", headers, "127.0.0.1"))
        return answer.status, answer.body, answer.headers

    status, plain, headers = scrape()
    assert status == 200 and headers == {"Vary": "Accept, Accept-Encoding"} and plain.startswith(b"# HELP")
    for _ in range(3):  # Prometheus's header: gzip, the same bytes each time, compressed once
        status, body, headers = scrape(**{"accept-encoding": "gzip"})
        assert headers == {"Vary": "Accept, Accept-Encoding", "Content-Encoding": "gzip"}
        assert gzip.decompress(body) == plain and len(body) < len(plain) / 3
    assert len(compressions) == 1
    assert scrape(**{"accept-encoding": "gzip;q=0"})[2] == {"Vary": "Accept, Accept-Encoding"}  # refused

    # A scraper that takes gzip at a steady pace: the next snapshot is rendered and compressed
    # before it is published, so its scrape does neither.
    now = time.monotonic()
    paced(web, now, gzip=True)
    holder.publish(snapshot(2))
    assert len(compressions) == 2
    body = scrape(**{"accept-encoding": "gzip"})[1]
    assert b"lagwatch_cycles_total 2.0" in gzip.decompress(body) and len(compressions) == 2


PROMETHEUS_PROTO = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;"
                    "q=0.6,application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
                    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;"
                    "escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1")


def test_the_format_and_coding_the_last_scrape_took_are_written_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Prometheus asking for protobuf in gzip is answered from memory: that body, compressed,
    was written before the snapshot was published, and nothing else was."""
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)
    holder.publish(snapshot(1))
    asked = choose_format(PROMETHEUS_PROTO).format
    assert asked is formats.PROTOBUF
    now = time.monotonic()
    paced(web, now, fmt=asked, gzip=True)  # as the scrapes with that header record themselves
    written: list[str] = []
    real = web_module.Rendered.body

    def body(self: web_module.Rendered, fmt: web_module.Format) -> bytes:
        if fmt.key not in self._bodies:
            written.append(fmt.key)
        return real(self, fmt)

    monkeypatch.setattr(web_module.Rendered, "body", body)
    holder.publish(snapshot(2))
    assert written == ["protobuf"]
    body, content_type, coding = web.metrics(PROMETHEUS_PROTO, "gzip")
    assert written == ["protobuf"] and coding == "gzip"
    assert content_type.startswith("application/vnd.google.protobuf;")
    assert web._rendered is not None and web._rendered._gzipped.keys() == {"protobuf"}


def test_a_scrape_due_inside_the_next_cycles_render_is_served_this_cycles_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Renders take 0.5 s here (as a fleet's on a busy host) and the scrape is due 1.3 s from
    now, inside the next cycle's render (interval 1 s + 0.5 s): this cycle's snapshot is
    rendered for it, the next cycle renders nothing, and that scrape is served the one
    rendered (a cycle older than the one published by then) without a render of its own;
    a second scrape then is not (it is not the one expected)."""
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)
    assert CONFIG.interval == 1.0
    holder.publish(snapshot(1))
    now = time.monotonic()
    paced(web, now + 1.3)
    web._render_times.append(0.5)
    renders = counted(monkeypatch)
    holder.publish(snapshot(2))  # rendered ahead: the next cycle's render would end after the scrape
    assert len(renders) == 1
    holder.publish(snapshot(3))  # the same scrape still to come: nothing rendered
    assert len(renders) == 1
    time.sleep(1.3 - (time.monotonic() - now))
    assert b"lagwatch_cycles_total 2.0" in web.metrics(None)[0]  # the expected scrape, at once
    assert len(renders) == 1
    assert b"lagwatch_cycles_total 3.0" in web.metrics(None)[0]  # another: the current one, rendered
    assert len(renders) == 2


def test_without_the_next_cycles_render_in_the_way_nothing_is_rendered_a_cycle_early(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same, with renders that take no time: the scrape due in 1.3 s waits for the next
    cycle's snapshot (fresher), rendered ahead of it then."""
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)
    holder.publish(snapshot(1))
    now = time.monotonic()
    paced(web, now + 1.3)
    renders = counted(monkeypatch)
    holder.publish(snapshot(2))
    assert renders == []


@pytest.mark.parametrize(("took", "due_in", "rendered"), [
    ((0.45, 0.2), 1.5, 1),  # the last render was quick, the one before slow: the slow one counts
    ((0.1, 0.1), 1.3, 0),  # quick renders: the next cycle's render ends 0.1 s after it, long before the scrape
    ((2.0,), 1.85, 1),  # renders longer than the interval: begun no more than 0.9 of it early...
    ((2.0,), 2.5, 0),  # ... never a whole cycle early (it would be two cycles old when served)
])
def test_a_render_ahead_begins_twice_the_longest_recent_render_before_the_scrape(
        monkeypatch: pytest.MonkeyPatch, took: tuple[float, ...], due_in: float, rendered: int) -> None:
    """A fleet's render varies by half from one cycle to the next on a loaded host: judged by
    the last render alone, a scrape due just after the next cycle's render would land inside
    it. The margin is twice the longest of the last few, less than one interval. (The
    clock stands still: the cases are 50 ms from their thresholds.)"""
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)
    holder.publish(snapshot(1))
    now = time.monotonic()
    monkeypatch.setattr(web_module.time, "monotonic", lambda: now)
    paced(web, now + due_in)
    web._render_times.extend(took)
    renders = counted(monkeypatch)
    holder.publish(snapshot(2))
    assert len(renders) == rendered


def test_a_second_format_of_one_snapshot_builds_the_families_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The families are let go once a format is written: another format asked of the same
    snapshot builds them again (and both answers are that snapshot's)."""
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)
    holder.publish(snapshot(7))
    renders = counted(monkeypatch)
    text, _, _ = web.metrics(None)
    openmetrics, content_type, _ = web.metrics("application/openmetrics-text;version=1.0.0")
    assert b"lagwatch_cycles_total 7.0" in text and b"lagwatch_cycles_total 7.0" in openmetrics
    assert content_type.startswith("application/openmetrics-text") and openmetrics.endswith(b"# EOF\n")
    assert len(renders) == 2 and web.metrics(None)[0] is text  # each body kept, written once


def test_a_render_ahead_for_one_scraper_is_served_to_it_not_to_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Prometheus at a 15 s pace, its scrape due in 1.3 s, inside the next cycle's render
    (renders of 0.5 s): rendered for at this cycle, for it. Another client (a curl, the
    other of an HA pair) scraping just before it gets the current snapshot rendered for
    itself, not the render made for the Prometheus, which then gets the current one."""
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)
    holder.publish(snapshot(1))
    now = time.monotonic()
    paced(web, now + 1.3, scraper="10.0.0.1")
    web._render_times.append(0.5)
    renders = counted(monkeypatch)
    holder.publish(snapshot(2))  # rendered ahead, for 10.0.0.1
    assert len(renders) == 1
    holder.publish(snapshot(3))
    time.sleep(max(0.0, 1.2 - (time.monotonic() - now)))
    assert b"lagwatch_cycles_total 3.0" in web.metrics(None, None, "10.0.0.2")[0]  # not the other's render
    assert len(renders) == 2
    assert b"lagwatch_cycles_total 3.0" in web.metrics(None, None, "10.0.0.1")[0]  # the current one, ready
    assert len(renders) == 2


@pytest.mark.parametrize("published_after", [1, 2, 3])
def test_the_expected_scrape_is_served_its_render_ahead_whatever_was_published_since(
        monkeypatch: pytest.MonkeyPatch, published_after: int) -> None:
    """A render ahead is begun up to the longest recent gap between publishes and a margin
    before the scrape, and delays its own cycle's publish by the render; cycles that do not
    fit the interval publish at uneven gaps, so one, two or more may publish before the
    scrape. The scrape it was made for is served it, not made to wait for a render."""
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)
    holder.publish(snapshot(1))
    now = time.monotonic()
    monkeypatch.setattr(web_module.time, "monotonic", lambda: now)
    paced(web, now + 1.8)
    web._render_times.append(0.5)
    renders = counted(monkeypatch)
    holder.publish(snapshot(2))  # rendered ahead of the scrape due in 1.8 s
    assert len(renders) == 1
    for cycles in range(3, 3 + published_after):
        holder.publish(snapshot(cycles))
    assert len(renders) == 1
    monkeypatch.setattr(web_module.time, "monotonic", lambda: now + 1.8)
    assert b"lagwatch_cycles_total 2.0" in web.metrics(None)[0]
    assert len(renders) == 1
    assert web.served == {"ready": 1, "waited": 0}


@pytest.mark.parametrize("late", [8.0, 1.2])
def test_a_render_ahead_is_not_served_to_a_scrape_more_than_an_interval_off_its_time(
        monkeypatch: pytest.MonkeyPatch, late: float) -> None:
    """The scraper's scrape comes 8 s (more than half its 15 s pace) or 1.2 s (more than the
    1 s interval) after the one expected: not the scrape the render was made for, whose
    age would grow with the lateness; the current snapshot is rendered for it."""
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)
    holder.publish(snapshot(1))
    now = time.monotonic()
    monkeypatch.setattr(web_module.time, "monotonic", lambda: now)
    paced(web, now + 1.8)
    web._render_times.append(0.5)
    renders = counted(monkeypatch)
    holder.publish(snapshot(2))
    holder.publish(snapshot(3))
    monkeypatch.setattr(web_module.time, "monotonic", lambda: now + 1.8 + late)
    assert b"lagwatch_cycles_total 3.0" in web.metrics(None)[0]
    assert len(renders) == 2


@pytest.mark.parametrize(("gap", "due_in", "rendered"), [
    (1.0, 2.5, 0),  # cycles a second apart: the next cycle renders for a scrape 2.5 s away
    (2.5, 2.5, 1),  # cycles 2.5 s apart (they do not fit the 1 s interval): this one does
    (2.5, 2.9, 1),  # ... up to the gap and the margin (0.45 s: renders of 0.2 s)...
    (2.5, 3.0, 0),  # ... and no further (the clock stands still: 50 ms either side)
])
def test_a_render_ahead_reaches_as_far_as_the_longest_recent_gap_between_publishes(
        monkeypatch: pytest.MonkeyPatch, gap: float, due_in: float, rendered: int) -> None:
    """Cycles that overrun the interval publish at longer, uneven gaps: judged by the
    interval alone, a scrape due between two cycles' horizons was rendered for by neither
    and rendered for itself (9 of 85 paced scrapes at 300 x 3 on a loaded host)."""
    holder, web, clock = frozen_server(monkeypatch)
    for cycles in range(1, 5):  # published ``gap`` apart, nobody scraping
        holder.publish(snapshot(cycles))
        clock[0] += gap
    clock[0] -= gap
    web._render_times.append(0.2)
    paced(web, clock[0] + gap + due_in)  # the next publish is ``gap`` away
    clock[0] += gap
    renders = counted(monkeypatch)
    holder.publish(snapshot(5))
    assert len(renders) == rendered


@pytest.mark.parametrize(("long_gap_ago", "rendered"), [(20, 1), (21, 0)])
def test_a_rare_long_gap_between_publishes_is_remembered_for_twenty_gaps(
        monkeypatch: pytest.MonkeyPatch, long_gap_ago: int, rendered: int) -> None:
    """An overloaded fleet publishes mostly 1.5 s apart and skips a cycle now and then (a
    gap of 3 s): a scrape due 3.2 s after this publish may come before the next, and is
    rendered for now while such a gap is among the last twenty; once it is not, the next
    cycle is expected in 1.5 s and renders for it."""
    holder, web, clock = frozen_server(monkeypatch)
    gaps = [3.0] + [1.5] * (long_gap_ago - 1)
    holder.publish(snapshot(1))
    for cycles, gap in enumerate(gaps[:-1], start=2):
        clock[0] += gap
        holder.publish(snapshot(cycles))
    web._render_times.append(0.2)  # a margin of 0.45 s
    clock[0] += gaps[-1]
    paced(web, clock[0] + 3.2)
    renders = counted(monkeypatch)
    holder.publish(snapshot(len(gaps) + 1))
    assert len(renders) == rendered


def test_a_stall_does_not_stretch_a_render_ahead_past_three_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    """One gap of 20 s between publishes (a fleet's connect timeouts), then 1 s cycles: a
    scrape due 14 s on is not rendered for now (it would be served 14 s old); the next
    publishes are expected within three intervals at most."""
    holder, web, clock = frozen_server(monkeypatch)
    holder.publish(snapshot(1))
    clock[0] += 20.0
    paced(web, clock[0] + 14.0)
    renders = counted(monkeypatch)
    holder.publish(snapshot(2))
    assert renders == []
    assert web._publishes.next_within(1.0) == 3.0


def test_gaps_kept_under_another_interval_are_dropped_on_a_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cycles 10 s apart, then a reload to 1 s: the old gaps no longer say when the next
    publish comes (a scrape due in 2.5 s is rendered for by a later cycle, fresher)."""
    config = [parse_config({"interval": "10s", "clusters": [{"name": "m", "primary": {"dsn": "host=a"}}]})]
    holder, web, clock = frozen_server(monkeypatch, lambda: config[0])
    for cycles in range(1, 4):
        holder.publish(snapshot(cycles))
        clock[0] += 10.0
    assert web._publishes.next_within(10.0) == 10.0
    config[0] = CONFIG  # reloaded: interval 1 s
    paced(web, clock[0] + 2.5)
    renders = counted(monkeypatch)
    holder.publish(snapshot(4))
    assert renders == []
    assert web._publishes.next_within(1.0) == 1.0


def test_an_ha_pairs_two_scrapes_due_close_together_share_one_render_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two Prometheus servers 0.8 s apart at a 15 s pace, on a fleet whose cycles publish
    2.5 s apart: the render made for the first serves the second too (it is within its
    reach), rather than the next cycle rendering for the second and throwing away the
    first's; each is served it once."""
    holder, web, clock = frozen_server(monkeypatch)
    for cycles in range(1, 4):
        holder.publish(snapshot(cycles))
        clock[0] += 2.5
    web._render_times.append(0.2)  # reach: 2.5 s gaps and a 0.45 s margin
    start = clock[0]
    paced(web, start + 2.0, scraper="10.0.0.1")
    paced(web, start + 2.8, scraper="10.0.0.2")
    renders = counted(monkeypatch)
    holder.publish(snapshot(4))  # rendered for the first
    clock[0] = start + 1.0
    holder.publish(snapshot(5))  # the second's turn: the same render serves it
    clock[0] = start + 1.9
    holder.publish(snapshot(6))
    assert len(renders) == 1
    clock[0] = start + 2.0
    assert b"lagwatch_cycles_total 4.0" in web.metrics(None, None, "10.0.0.1")[0]
    clock[0] = start + 2.8
    assert b"lagwatch_cycles_total 4.0" in web.metrics(None, None, "10.0.0.2")[0]
    assert len(renders) == 1
    assert b"lagwatch_cycles_total 6.0" in web.metrics(None, None, "10.0.0.2")[0]  # once each
    assert len(renders) == 2


def test_a_scrape_that_never_came_is_let_go_not_carried_into_every_render(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scraper stops after a render was made ahead of its scrape: once that scrape is an
    interval late, the next render ahead (for another scraper) does not carry it."""
    holder, web, clock = frozen_server(monkeypatch)
    holder.publish(snapshot(1))
    start = clock[0]
    paced(web, start + 0.5, scraper="10.0.0.1")
    holder.publish(snapshot(2))  # rendered ahead of 10.0.0.1's scrape; it never comes
    assert web._rendered is not None and [d.scraper for d in web._rendered.ahead_of] == ["10.0.0.1"]
    clock[0] = start + 2.0  # 1.5 s late: past an interval
    paced(web, start + 2.5, scraper="10.0.0.2")
    renders = counted(monkeypatch)
    holder.publish(snapshot(3))
    assert web._rendered is not None and [d.scraper for d in web._rendered.ahead_of] == ["10.0.0.2"]
    clock[0] = start + 2.2
    holder.publish(snapshot(4))  # nothing more: the late scrape is not rendered for again
    assert len(renders) == 1


def test_a_due_served_the_current_render_is_not_kept_for_a_later_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    """A render made ahead of 10.0.0.1's scrape serves it as the current snapshot: that due
    is done with, and the next cycle renders afresh for 10.0.0.2 rather than keep the older
    render for it as if 10.0.0.1 were still to come."""
    holder, web, clock = frozen_server(monkeypatch)
    holder.publish(snapshot(1))
    start = clock[0]
    paced(web, start + 0.5, scraper="10.0.0.1")
    paced(web, start + 1.0, scraper="10.0.0.2")
    renders = counted(monkeypatch)
    holder.publish(snapshot(2))  # rendered ahead of 10.0.0.1's scrape
    clock[0] = start + 0.5
    assert b"lagwatch_cycles_total 2.0" in web.metrics(None, None, "10.0.0.1")[0]  # the current one
    clock[0] = start + 0.7
    holder.publish(snapshot(3))  # 10.0.0.2 due in 0.3 s, within the first render's reach: rendered afresh
    assert len(renders) == 2
    clock[0] = start + 1.0
    assert b"lagwatch_cycles_total 3.0" in web.metrics(None, None, "10.0.0.2")[0]


def test_a_late_scrape_renders_for_itself_and_the_next_on_the_grid_is_served_ahead(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Prometheus's grid, 15 s apart, a cycle a second; one scrape 1.6 s late (a scraper
    starved on its host): it renders for itself, and the next, back on the grid, is served
    what the cycle rendered ahead of it. (Expected 15 s after the late one, it rendered
    when asked too: bench/fleet.py on an overloaded host, docs/benchmarks.md.)"""
    holder, web, clock = frozen_server(monkeypatch)
    start = clock[0]
    paced(web, start + 60.0)  # scrapes at +15, +30 and +45
    scrapes = {61.6: "late", 75.0: "on the grid", 90.0: "on the grid"}
    events = sorted([(k + 0.5, "publish") for k in range(46, 91)] + [(at, "scrape") for at in scrapes])
    asked = []
    for at, what in events:
        clock[0] = start + at
        if what == "publish":
            holder.publish(snapshot(int(at)))
        else:
            before = web.renders["asked"]
            web.metrics(None, None, "")
            asked.append((at, web.renders["asked"] - before))
    assert asked == [(61.6, 1), (75.0, 0), (90.0, 0)]
