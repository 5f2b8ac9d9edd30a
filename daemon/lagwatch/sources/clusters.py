"""Where the clusters come from, and when that changes: the config file, its clusters_dir
(one file per cluster, looked at every cycle, at most once a second), and the members
Patroni names for a discovered cluster (asked while the nodes are polled, never waited
for: an answer is taken by the first cycle that ends after it).

The daemon asks ``effective()`` for the config to run and, each cycle, ``take_changes()``
whether it changed; a change it could not put in force (``failed()``) is offered again
every cycle until it can. A reload prepares a new set of sources beside this one
(``reloaded()``, which never touches the running one) and ``adopt()``s it once the runtime
built from it is in force.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from lagwatch.config import Config
from lagwatch.estimate.snapshot import DiscoveryStatus
from lagwatch.sources.clusterdir import ClusterDir
from lagwatch.sources.discovery import Discovery, room_for

log = logging.getLogger("lagwatch.daemon")

CLUSTER_DIR_SCAN_SECONDS = 1.0  # how often clusters_dir is looked at (every cycle, at most once a second)


@dataclass(frozen=True)
class Reloaded:
    """A reloaded file and its cluster directory, read beside the running ones."""

    file_config: Config
    cluster_dir: ClusterDir | None
    source: Config  # the file's clusters and the directory's


class ClusterSources:
    def __init__(self, config: Config, now: float) -> None:
        self.discovery = Discovery()
        self.ask_every_cycle = True  # one-shot commands ask once (ask_now) and must not wait on a second ask
        self._adopt(self.read(config), now)
        self._asking: asyncio.Future[bool] | None = None
        self._pending = False  # a change that could not be put in force yet
        self.errors = 0  # discovery tasks that failed unexpectedly (each logged with its trace)

    @staticmethod
    def read(config: Config, cluster_dir: ClusterDir | None = None) -> Reloaded:
        """``config``'s clusters and its directory's (``cluster_dir``: the running one, read
        again on a copy when it is the same folder; else a new one)."""
        folder = None
        if config.clusters_dir is not None:
            same = cluster_dir is not None and cluster_dir.path == config.clusters_dir
            folder = cluster_dir.copy() if same and cluster_dir is not None else ClusterDir(config.clusters_dir)
            folder.scan(_names(config))
        return Reloaded(config, folder, _with_dir(config, folder))

    def reloaded(self, config: Config) -> Reloaded:
        """A reloaded config's sources, read beside the running ones (a rejected reload
        leaves this one's record of what it read as it was)."""
        return self.read(config, self._dir)

    def adopt(self, reloaded: Reloaded, now: float) -> None:
        """The reloaded sources are the ones in force (their runtime is)."""
        self._adopt(reloaded, now)

    def _adopt(self, reloaded: Reloaded, now: float) -> None:
        self._file_config, self._dir, self.source = reloaded.file_config, reloaded.cluster_dir, reloaded.source
        self._scanned_at = now

    def effective(self, source: Config | None = None) -> Config:
        """What runs: the source's clusters with nodes, and the discovered ones as their
        members make them (``source``: a reloaded one's, else this one's)."""
        source = source or self.source
        clusters = (*source.clusters_with_nodes, *self.discovery.cluster_configs(source.patroni_clusters))
        return source.model_copy(update={"clusters": clusters})

    # -- discovery --------------------------------------------------------------------------

    def ask(self, budget: float) -> None:
        """Ask Patroni for the members, beside the cycle (not when an ask is under way)."""
        if self._asking is None and self.source.patroni_clusters and self.ask_every_cycle:
            self._asking = asyncio.ensure_future(
                self.discovery.refresh(self.source.patroni_clusters, budget, room_for(self.source)))

    async def ask_now(self, timeout: float) -> bool:
        """Ask and wait for the answer: whether there is a change to put in force."""
        changed = await self.discovery.refresh(self.source.patroni_clusters, timeout, room_for(self.source))
        return changed or self._pending

    def take_changes(self, now: float) -> bool:
        """Whether the clusters changed since the last look: members that an answer of
        Patroni's changed, cluster files added, changed, broken or removed (looked at
        once CLUSTER_DIR_SCAN_SECONDS have passed since the last look at ``now``), or a
        change that could not be put in force, offered again."""
        changed = self._take_members()
        if self._dir is not None and now - self._scanned_at >= CLUSTER_DIR_SCAN_SECONDS:
            self._scanned_at = now
            if self._dir.scan(_names(self._file_config)):
                self.source = _with_dir(self._file_config, self._dir)
                changed = True
            elif self._pending and self._asking is None:
                changed = True  # what could not be put in force yet: tried again
        return changed

    def _take_members(self) -> bool:
        task = self._asking
        if task is None or not task.done():
            return False
        self._asking = None
        try:
            changed = task.result()
        except Exception:  # refresh turns every expected failure into a status
            self.errors += 1
            log.exception("member discovery failed unexpectedly; the members in force stay")
            return False
        return changed or self._pending

    def failed(self, error: BaseException) -> None:
        """The change taken could not be put in force (``error`` says why): offered again
        next cycle; the first failure is logged with its trace, not every retry."""
        if not self._pending:
            log.error("the new members could not be put in force; keeping the previous ones "
                      "and trying again every cycle", exc_info=error)
        self._pending = True

    def in_force(self) -> None:
        """The change taken is in force."""
        if self._pending:
            log.info("the new members are in force")
        self._pending = False

    # -- what it says -------------------------------------------------------------------------

    def cluster_files(self) -> tuple[tuple[str, str | None], ...]:
        """Each cluster file and why it cannot be used as it is (None: in force as is)."""
        return tuple((f.path, f.error) for f in self._dir.files) if self._dir is not None else ()

    def statuses(self) -> tuple[DiscoveryStatus, ...]:
        return self.discovery.statuses(self.source.patroni_clusters)

    def describe(self) -> str | None:
        """clusters_dir's line for the start's log (None without one)."""
        if self._dir is None:
            return None
        return (f"clusters_dir {self._dir.path}: {len(self._dir.clusters)} cluster file(s) in force, "
                f"{sum(1 for f in self._dir.files if f.error is not None)} with errors")

    def close(self) -> None:
        if self._asking is not None:
            self._asking.cancel()  # its worker thread ends by its own deadline


def _with_dir(config: Config, folder: ClusterDir | None) -> Config:
    """The file's clusters and the directory's: their names are unique (the directory keeps
    out a file whose name is taken)."""
    if folder is None:
        return config
    return config.model_copy(update={"clusters": (*config.clusters, *folder.clusters)})


def _names(config: Config) -> set[str]:
    return {c.name for c in config.clusters}
