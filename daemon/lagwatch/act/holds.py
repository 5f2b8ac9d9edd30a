"""Operator holds (`lagwatch pool hold REPLICA in|out`, `release`), kept in a small JSON
file so they survive restarts; the daemon re-reads it when it changes (a ``stat`` a cycle).

Every read-modify-write happens under an exclusive lock on a lock file beside it
(``holds.json.lock``; the JSON file itself is replaced by a rename, so it cannot carry the
lock), and the daemon reads under a shared lock: ten operators holding ten replicas at
once keep all ten holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, cast

from lagwatch.files import write_atomically

Hold = Literal["in", "out"]
Holds = dict[str, dict[str, Hold]]  # cluster -> replica -> hold


class HoldsError(Exception):
    """The holds file cannot be read or written; the message says which file and why."""


class HoldStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        self._cache: tuple[tuple[int, int], Holds] | None = None

    def load(self) -> Holds:
        """The holds in force (shared lock, so never a file halfway through an update)."""
        with self._locked(fcntl.LOCK_SH, wait=0.5):
            return self._read()

    def for_cluster(self, cluster: str) -> dict[str, Hold]:
        return dict(self.load().get(cluster, {}))

    def current(self) -> Holds:
        """The holds in force, as the daemon asks every cycle: one ``stat``, and the file
        read (under the shared lock) only when it changed since it was last read. Callers
        must not change what it returns."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise HoldsError(f"{self.path}: cannot read holds: {exc.strerror}") from None
        cached = self._cache
        if cached is not None and cached[0] == (stat.st_ino, stat.st_mtime_ns):
            return cached[1]
        return self.load()

    def set(self, cluster: str, replica: str, hold: Hold | None) -> None:
        with self._locked(fcntl.LOCK_EX, wait=10.0):
            holds = {c: dict(r) for c, r in self._read().items()}
            if hold is None:
                holds.get(cluster, {}).pop(replica, None)
            else:
                holds.setdefault(cluster, {})[replica] = hold
            self._write(holds)

    def release_all(self, cluster: str | None) -> tuple[Holds, Path | None]:
        """Drop every hold (of ``cluster``, or of all clusters); returns what was dropped and,
        if the file could not be read, where its old content was kept. This is the way to
        repair a corrupt file through the CLI: with no cluster given it is rewritten."""
        with self._locked(fcntl.LOCK_EX, wait=10.0):
            try:
                holds = self._read()
            except HoldsError:
                if cluster is not None:
                    raise
                kept = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
                os.replace(self.path, kept)  # nothing lost: the operator can still read it
                self._write({})
                return {}, kept
            dropped = {c: r for c, r in holds.items() if cluster in (None, c)}
            self._write({c: r for c, r in holds.items() if c not in dropped})
            return dropped, None

    def _read(self) -> Holds:
        try:
            stat = self.path.stat()
            version = (stat.st_ino, stat.st_mtime_ns)  # an atomic rename changes the inode
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise HoldsError(f"{self.path}: cannot read holds: {exc.strerror}") from None
        if self._cache is not None and self._cache[0] == version:
            return self._cache[1]
        try:
            raw = json.loads(self.path.read_bytes())
        except OSError as exc:
            raise HoldsError(f"{self.path}: cannot read holds: {exc.strerror}") from None
        except (ValueError, RecursionError) as exc:
            raise HoldsError(f"{self.path}: not valid JSON ({str(exc).splitlines()[0][:120]}); "
                             "`lagwatch pool release --all` replaces it, keeping a copy") from None
        if not isinstance(raw, dict) or not all(isinstance(r, dict) for r in raw.values()):
            raise HoldsError(f"{self.path}: expected {{cluster: {{replica: \"in\"|\"out\"}}}}; "
                             "`lagwatch pool release --all` replaces it, keeping a copy")
        holds: Holds = {}
        for cluster, replicas in raw.items():
            holds[str(cluster)] = {str(r): cast(Hold, h) for r, h in replicas.items() if h in ("in", "out")}
        self._cache = (version, holds)
        return holds

    def _write(self, holds: Holds) -> None:
        holds = {c: r for c, r in holds.items() if r}
        try:
            write_atomically(self.path, json.dumps(holds, indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            raise HoldsError(f"{self.path}: cannot write holds: {exc.strerror or exc}") from None

    @contextlib.contextmanager
    def _locked(self, kind: int, wait: float) -> Iterator[None]:
        exclusive = kind == fcntl.LOCK_EX
        try:
            if exclusive:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, (os.O_RDWR | os.O_CREAT) if exclusive else os.O_RDONLY, 0o644)
        except OSError as exc:
            if not self.path.parent.is_dir():
                if not exclusive and not self.path.parent.exists():
                    yield  # no state_dir yet: nobody has written holds, nothing to race with
                    return
                raise HoldsError(f"{self.path.parent}: state_dir is not a directory and cannot be made one "
                                 f"({exc.strerror or exc})") from None
            if not exclusive and isinstance(exc, FileNotFoundError):
                yield  # no lock file yet: nobody has written holds, there is nothing to race with
                return
            if not exclusive and isinstance(exc, PermissionError):
                yield  # may not open the lock: reading a renamed-into-place file is still whole
                return
            raise HoldsError(f"{self.lock_path}: cannot open the holds lock: {exc.strerror or exc}") from None
        try:
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, kind | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise HoldsError(f"{self.lock_path}: still locked after {wait:.0f}s "
                                         "(another lagwatch pool command?)") from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)
