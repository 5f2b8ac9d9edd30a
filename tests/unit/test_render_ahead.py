"""/metrics rendered once per snapshot: ahead of a scrape Prometheus's pace says is due,
before the snapshot is published, so a scrape in between never renders it a second time."""

from __future__ import annotations

import time

import pytest
from lagwatch.config import parse_config
from lagwatch.estimate.snapshot import Snapshot, SnapshotHolder
from lagwatch.serve import web as web_module
from lagwatch.serve.web import WebServer

CONFIG = parse_config({"clusters": [{"name": "m", "primary": {"dsn": "host=a"}}]})


def snapshot(cycles: int) -> Snapshot:
    return Snapshot(taken_at=float(cycles), cycle_duration=0.01, cycles_total=cycles, overruns_total=0, clusters=())


def test_a_due_scrape_is_served_what_was_rendered_before_publishing(monkeypatch: pytest.MonkeyPatch) -> None:
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)  # never started: metrics() is called directly
    holder.publish(snapshot(1))
    now = time.monotonic()
    for ago in (45.0, 30.0, 15.0):  # a scrape every 15 s; the next is due now
        web._scrapes.scraped(now - ago)
    renders = []
    real = web_module.render_text
    monkeypatch.setattr(web_module, "render_text", lambda families: renders.append(1) or real(families))

    between = []  # what a scrape gets after the render ahead, before the snapshot is published
    holder.on_publish.append(lambda s: between.append((holder.get(), web.metrics("")[0])))
    holder.publish(snapshot(2))
    assert len(renders) == 1  # ahead, and only ahead
    (seen, body), = between
    assert seen is not None and seen.cycles_total == 1  # readers did not see snapshot 2 yet...
    assert b"lagwatch_cycles_total 2.0" in body  # ...but its text was ready and served
    assert b"lagwatch_cycles_total 2.0" in web.metrics("")[0]
    assert len(renders) == 1


def test_nobody_scraping_renders_nothing_and_an_unexpected_scrape_renders_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)
    renders = []
    real = web_module.render_text
    monkeypatch.setattr(web_module, "render_text", lambda families: renders.append(1) or real(families))
    for cycles in range(1, 5):
        holder.publish(snapshot(cycles))
    assert renders == []
    assert b"lagwatch_cycles_total 4.0" in web.metrics("")[0]
    assert b"lagwatch_cycles_total 4.0" in web.metrics("")[0]
    assert len(renders) == 1


def test_a_slow_render_of_an_older_snapshot_never_replaces_a_newer_one(monkeypatch: pytest.MonkeyPatch) -> None:
    holder = SnapshotHolder()
    web = WebServer("127.0.0.1", 0, holder, lambda: CONFIG)
    older, newer = snapshot(1), snapshot(2)
    web._render(newer)  # rendered ahead while a scrape was rendering the one before
    web._render(older)  # that scrape ends later
    holder.publish(newer)
    renders = []
    real = web_module.render_text
    monkeypatch.setattr(web_module, "render_text", lambda families: renders.append(1) or real(families))
    assert b"lagwatch_cycles_total 2.0" in web.metrics("")[0]
    assert renders == []  # served what was rendered ahead


def test_a_failing_hook_still_publishes() -> None:
    holder = SnapshotHolder()

    def broken(s: Snapshot) -> None:
        raise RuntimeError("a bug in a hook")

    holder.on_publish.append(broken)
    with pytest.raises(RuntimeError):
        holder.publish(snapshot(1))
    assert holder.get() is not None and holder.get().cycles_total == 1  # type: ignore[union-attr]
