"""What every view module provides: SQL by minimum server version, and a pure parser."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

Row = Mapping[str, Any]
Role = Literal["primary", "replica"]
T = TypeVar("T")


@dataclass(frozen=True)
class View(Generic[T]):
    """One PostgreSQL view (or function) lagwatch reads.

    ``queries`` maps a minimum ``server_version_num`` to the SQL for servers from that
    version on; ``parse`` turns the rows into an immutable value and does no I/O.
    """

    name: str
    roles: frozenset[Role]
    queries: Mapping[int, str]
    parse: Callable[[Sequence[Row]], T]

    def sql_for(self, server_version_num: int) -> str | None:
        usable = [v for v in self.queries if v <= server_version_num]
        return self.queries[max(usable)] if usable else None


def opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
