"""The one cadence rule (views/cadence.py): which views a poll reads, what the polls between carry."""

from __future__ import annotations

from typing import Any

from lagwatch import rooms
from lagwatch.views import CYCLE_VIEWS
from lagwatch.views.base import SLOW_EVERY, View
from lagwatch.views.cadence import Cadence


def view(name: str, every: int = 1, keep: bool = True) -> View[Any]:
    return View(name, frozenset({"primary"}), {130000: "SELECT 1"}, lambda rows: rows, every=every, keep=keep)


EACH, SLOW, RATE = view("each"), view("slow", every=3), view("rate", every=3, keep=False)
APPLYING = (EACH, SLOW, RATE)


def poll(cadence: Cadence, n: int, read: dict[str, Any], failed: dict[str, str] | None = None,
         resting: frozenset[str] = frozenset()) -> tuple[list[str], dict[str, Any], dict[str, bool]]:
    """Poll ``n``: the views chosen, then what the poll reports when ``read`` came back."""
    chosen = [v.name for v in cadence.choose(APPLYING, n)]
    results = {k: v for k, v in read.items() if k in chosen}
    health = {name: True for name in results} | {name: False for name in failed or {}}
    cadence.carry(APPLYING, n, results, failed or {}, health, lambda name: name in resting)
    return chosen, results, health


def test_read_every_n_polls_carry_the_last_between_rates_carry_nothing() -> None:
    c = Cadence()
    # (poll, what the server answered, views chosen, results reported, health reported)
    table = [
        (0, {"each": 1, "slow": "a", "rate": 10}, ["each", "slow", "rate"], {"each": 1, "slow": "a", "rate": 10},
         {"each": True, "slow": True, "rate": True}),
        (1, {"each": 2}, ["each"], {"each": 2, "slow": "a"}, {"each": True, "slow": True, "rate": True}),
        (2, {"each": 3}, ["each"], {"each": 3, "slow": "a"}, {"each": True, "slow": True, "rate": True}),
        (3, {"each": 4, "slow": "b", "rate": 11}, ["each", "slow", "rate"], {"each": 4, "slow": "b", "rate": 11},
         {"each": True, "slow": True, "rate": True}),
        (4, {"each": 5}, ["each"], {"each": 5, "slow": "b"}, {"each": True, "slow": True, "rate": True}),
    ]
    for n, read, chosen, results, health in table:
        assert poll(c, n, read) == (chosen, results, health), n


def test_the_choice_is_the_same_tuple_so_each_statement_is_prepared_once() -> None:
    c = Cadence()
    assert c.choose(APPLYING, 1) is c.choose(APPLYING, 2) is c.choose(APPLYING, 4)
    assert c.choose(APPLYING, 0) is c.choose(APPLYING, 3)
    assert c.choose(APPLYING, 0) is not c.choose(APPLYING, 1)
    other = (EACH, SLOW)  # another probe's views (a failover): chosen afresh, never an old choice
    assert c.choose(other, 0) == (EACH, SLOW)


def test_nothing_is_carried_past_a_node_that_did_not_answer() -> None:
    c = Cadence()
    poll(c, 0, {"each": 1, "slow": "a", "rate": 10})
    c.forget()  # the poll failed: the node did not answer
    assert poll(c, 1, {"each": 2}) == (["each"], {"each": 2}, {"each": True})


def test_a_failed_or_resting_read_is_not_covered_by_an_older_one() -> None:
    c = Cadence()
    poll(c, 0, {"each": 1, "slow": "a", "rate": 10})
    # Due at 3, the slow view fails: the polls after say so, and carry no older value.
    assert poll(c, 3, {"each": 4, "rate": 11}, failed={"slow": "denied"}) == (
        ["each", "slow", "rate"], {"each": 4, "rate": 11}, {"each": True, "slow": False, "rate": True})
    assert poll(c, 4, {"each": 5}, resting=frozenset({"slow"})) == (["each"], {"each": 5}, {"each": True, "rate": True})


def test_the_slow_views_share_one_cadence() -> None:
    """Views read one poll in N are due together: a connection prepares two statements, not
    one per combination of them."""
    slow = {v.name: v.every for v in (*CYCLE_VIEWS, *rooms.VIEWS) if v.every > 1}
    assert slow == {"startup_io": SLOW_EVERY, "slotsync": SLOW_EVERY, "horizon": SLOW_EVERY,
                    "subscriptions": SLOW_EVERY}
