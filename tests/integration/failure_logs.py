"""What a failing integration test prints: the tail of every lagwatch log and every
server log that was live when it failed.

A red run on CI is read once, from its output: without lagwatch's own lines and the
servers' beside the assertion, a failure that depends on the day cannot be told apart
from a regression. Lagwatch processes and test clusters register here while they run
(``watch``/``unwatch``); conftest's report hook adds their tails to a failed test's
report, those stopped during the test as well (a ``with Lagwatch(...)`` in the test has
ended by the time the report is made; its log file is still there).
"""

from __future__ import annotations

from collections.abc import Callable

TAIL_LINES = 40

# id(owner) -> (name, a function that returns that log's tail); insertion order is start order.
_LIVE: dict[int, tuple[str, Callable[[int], str]]] = {}
_ENDED: dict[int, tuple[str, Callable[[int], str]]] = {}  # stopped during the current test


def watch(owner: object, name: str, tail: Callable[[int], str]) -> None:
    """Keep ``owner``'s log tail at hand while it runs."""
    _LIVE[id(owner)] = (name, tail)


def unwatch(owner: object) -> None:
    """``owner`` stopped: its tail as of now is kept for the rest of the test (its folder
    may be removed next)."""
    ended = _LIVE.pop(id(owner), None)
    if ended is not None:
        name, tail = ended
        text = _read(tail, TAIL_LINES)
        _ENDED[id(owner)] = (name, lambda lines: "\n".join(text.splitlines()[-lines:]))


def new_test() -> None:
    """A test begins: what stopped before it is not its own."""
    _ENDED.clear()


def tails(lines: int = TAIL_LINES) -> list[tuple[str, str]]:
    """(section title, tail) of every log live now or stopped during the current test; a
    log that cannot be read says why."""
    return [(f"tail of {name}", _read(tail, lines)) for name, tail in [*_ENDED.values(), *_LIVE.values()]]


def _read(tail: Callable[[int], str], lines: int) -> str:
    try:
        return tail(lines)
    except Exception as exc:  # a report must never fail on a log it cannot read
        return f"<cannot read: {exc!r}>"
