"""Operator holds (`lagwatch pool hold REPLICA in|out`, `release`), kept in a small JSON
file so they survive restarts; the daemon re-reads it when it changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, cast

from lagwatch.files import write_atomically

Hold = Literal["in", "out"]
Holds = dict[str, dict[str, Hold]]  # cluster -> replica -> hold


class HoldStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._cache: tuple[tuple[int, int], Holds] | None = None

    def load(self) -> Holds:
        try:
            stat = self.path.stat()
            mtime = (stat.st_ino, stat.st_mtime_ns)  # an atomic rename changes the inode
        except FileNotFoundError:
            return {}
        if self._cache is not None and self._cache[0] == mtime:
            return self._cache[1]
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.path}: cannot read holds: {exc}") from None
        if not isinstance(raw, dict) or not all(isinstance(r, dict) for r in raw.values()):
            raise ValueError(f"{self.path}: expected {{cluster: {{replica: in|out}}}}")
        holds: Holds = {}
        for cluster, replicas in raw.items():
            holds[str(cluster)] = {str(r): cast(Hold, h) for r, h in replicas.items() if h in ("in", "out")}
        self._cache = (mtime, holds)
        return holds

    def for_cluster(self, cluster: str) -> dict[str, Hold]:
        return dict(self.load().get(cluster, {}))

    def set(self, cluster: str, replica: str, hold: Hold | None) -> None:
        holds = {c: dict(r) for c, r in self.load().items()}
        if hold is None:
            holds.get(cluster, {}).pop(replica, None)
        else:
            holds.setdefault(cluster, {})[replica] = hold
        holds = {c: r for c, r in holds.items() if r}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, json.dumps(holds, indent=2, sort_keys=True) + "\n")
