"""The heartbeat row as a replica has replayed it (heartbeat.py writes it on the primary):
its sequence number, read in the same statement as the replay position.

Built per cluster (the table and this instance's row are configured), so the statement
carries them as quoted literals; the table name is checked by the config's pattern.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from lagwatch.views.base import Row, View, opt_int

NAME = "heartbeat"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def row_id(configured: str | None) -> str:
    """This instance's row: as configured, else the host's name."""
    return configured or socket.gethostname()


def view_for(table: str, row_id: str) -> View[int | None]:
    sql = f"SELECT seq FROM {table} WHERE id = {_literal(row_id)}"
    return View(NAME, frozenset({"replica"}), {130000: sql}, parse)


def parse(rows: Sequence[Row]) -> int | None:
    return opt_int(rows[0]["seq"]) if rows else None
