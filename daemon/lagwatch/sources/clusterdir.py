"""A directory of cluster files (``clusters_dir:``), one YAML file per cluster, read the way
Prometheus reads ``file_sd`` files: picked up on change without a restart, each validated
on its own.

Each ``*.yaml`` / ``*.yml`` file holds what one entry of ``clusters:`` holds (a static
cluster or a Patroni-discovered one); ``name`` defaults to the file's name without its
suffix. A file that does not validate is reported (its error, with its path, in the log
and in ``lagwatch_cluster_config_errors{file}``) and skipped: a new file is not watched
until it is fixed; a file that breaks keeps its last good version in force, as a bad
config reload keeps the running config. The other files are never affected. A cluster
name another file (or the main config) already uses is such an error too.

``scan`` stats the directory's files and re-reads only those that changed (inode, size,
modification time), so it is cheap enough to run every cycle.

Only files inside the directory are read. A symbolic link that resolves to a file outside
it (``/etc/shadow``, with lagwatch running as root) is refused by its own name, its
target never opened, and a dangling one is reported once; links within the directory
(a Kubernetes ConfigMap's ``..data/``) are followed. That check of the name cannot be the
last word (a file swapped for a link just after it would be followed), so the file is
opened without following a last link and what was opened is checked to be inside before
it is read (yamlfile.read_text's ``inside``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from lagwatch.config import CLUSTER_KINDS, POOLER_KINDS, AnyClusterConfig, Config
from lagwatch.errors import ConfigError, one_line, validation_problems
from lagwatch.yamlfile import load_yaml

log = logging.getLogger("lagwatch.sources.clusterdir")

SUFFIXES = (".yaml", ".yml")
MAX_FILE_BYTES = 256 * 1024  # one cluster's file
CHANGED_WHILE_READ = "changed while it was read: read again at the next scan"
_ADAPTER: TypeAdapter[AnyClusterConfig] = TypeAdapter(AnyClusterConfig)


@dataclass(frozen=True)
class ClusterFile:
    """One file's standing, as the last scan left it."""

    path: str
    cluster: AnyClusterConfig | None  # in force: this version or the last good one (None: never good)
    error: str | None  # why the file as it is now cannot be used (None: it is in force as is)


def parse_cluster_file(path: Path, inside: Path | None = None) -> AnyClusterConfig:
    """The cluster one file holds; ConfigError (every problem with its key path) if none.
    ``inside``: the directory it must be read from (yamlfile.read_text)."""
    data = load_yaml(path, MAX_FILE_BYTES, inside)
    if not isinstance(data, dict):
        raise ConfigError(str(path), ["(top level): expected the mapping of one cluster (name, primary, ...)"])
    data = {"name": _stem(path), **data}
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        # Paths as in a cluster of the main config, less the cluster kind pydantic puts first.
        problems = validation_problems(exc, {"clusters": CLUSTER_KINDS, "pooler": POOLER_KINDS})
        raise ConfigError(str(path), [_untagged(p) for p in problems]) from None


def _untagged(problem: str) -> str:
    for kind in CLUSTER_KINDS:
        if problem.startswith(f"{kind}."):
            return problem[len(kind) + 1:]
    return problem


def _stem(path: Path) -> str:
    return path.name.rsplit(".", 1)[0]


@dataclass
class _Entry:
    signature: tuple[int, int, int]  # inode, size, mtime_ns
    good: AnyClusterConfig | None  # the last version that validated (None: never)
    problem: str | None  # why the file as it is now does not validate


class ClusterDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, _Entry] = {}  # file name -> what was read
        self._standing: dict[str, ClusterFile] = {}  # file name -> in force or not, and why
        self._dir_error: str | None = None
        self._reserved: set[str] | None = None  # the main config's names at the last standing

    def copy(self) -> ClusterDir:
        """A copy that knows what this one has read (a reload rescans the copy: it says only
        what changed, and a rejected reload leaves this one as it was)."""
        other = ClusterDir(self.path)
        other._entries, other._standing, other._reserved = dict(self._entries), dict(self._standing), self._reserved
        return other

    @property
    def files(self) -> tuple[ClusterFile, ...]:
        return tuple(self._standing[name] for name in sorted(self._standing))

    @property
    def clusters(self) -> tuple[AnyClusterConfig, ...]:
        """The clusters in force, by file name (a broken file's last good version included)."""
        return tuple(f.cluster for f in self.files if f.cluster is not None)

    def scan(self, reserved: Collection[str] = ()) -> bool:
        """Re-read what changed; True when the clusters in force changed. ``reserved``: the
        cluster names the main config uses (a file may not take one)."""
        before = self.clusters
        try:
            found = self._listing()
        except OSError as exc:
            # The directory itself is gone or unreadable: keep every cluster in force.
            problem = f"cannot read {self.path}: {exc.strerror or exc}"
            if problem != self._dir_error:
                log.error("clusters_dir: %s; keeping the %d cluster(s) in force", problem, len(before))
            self._dir_error = problem
            return False
        if self._dir_error is not None:
            log.info("clusters_dir: %s can be read again", self.path)
            self._dir_error = None
        touched = False
        for name in set(self._entries) - set(found):
            log.info("clusters_dir: %s removed%s", self.path / name, _naming(self._entries[name].good))
            del self._entries[name]
            touched = True
        for name, signature in sorted(found.items()):
            entry = self._entries.get(name)
            if entry is None or entry.signature != signature:
                self._entries[name] = self._read(name, signature, entry)
                touched = True
        if not touched and set(reserved) == self._reserved:
            return False  # nothing changed since the last look (the usual case, every second)
        self._reserved = set(reserved)
        self._stand(reserved)
        return self.clusters != before

    def _listing(self) -> dict[str, tuple[int, int, int]]:
        found = {}
        with os.scandir(self.path) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.name.endswith(SUFFIXES):
                    continue  # editors' swap and backup files, dotfiles
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    try:  # a dangling link: reported (by _read), not skipped in silence
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed between the listing and the stat
                found[entry.name] = (st.st_ino, st.st_size, st.st_mtime_ns)
        return found

    def _read(self, name: str, signature: tuple[int, int, int], entry: _Entry | None) -> _Entry:
        path = self.path / name
        refusal = link_refusal(self.path, path)
        if refusal is not None:
            return _Entry(signature, entry.good if entry is not None else None, refusal)
        try:
            cluster = parse_cluster_file(path, inside=self.path)
        except ConfigError as exc:
            return _Entry(signature, entry.good if entry is not None else None, "; ".join(exc.problems))
        if entry is None or entry.good != cluster:
            log.info("clusters_dir: %s %s%s", path, "added" if entry is None else "changed", _naming(cluster))
        return _Entry(signature, cluster, None)

    def _stand(self, reserved: Collection[str]) -> None:
        """Which file's cluster is in force. A cluster name already in use (the main config,
        or a file before this one by name) keeps the later file's cluster out."""
        taken = {n: "the main config" for n in reserved}
        standing = {}
        for name, entry in sorted(self._entries.items()):
            path = str(self.path / name)
            cluster, problem = entry.good, entry.problem
            if cluster is not None and cluster.name in taken:
                problem = f"name: cluster name {cluster.name!r} is already used by {taken[cluster.name]}"
                cluster = None
            elif cluster is not None:
                taken[cluster.name] = path
            standing[name] = ClusterFile(path, cluster, problem)
            before = self._standing.get(name)
            if problem is not None and (before is None or before.error != problem):
                log.error("clusters_dir: %s: %s (%s)", path, problem, "its last good version stays in force"
                          if cluster is not None else "not watched until it is fixed")
            elif problem is None and before is not None and before.error is not None:
                log.info("clusters_dir: %s is in force again", path)
        self._standing = standing


def link_refusal(directory: Path, path: Path) -> str | None:
    """Why ``path``, a symbolic link in ``directory``, is not read (None: it is not a link,
    or one to a file inside the directory). Names neither the target nor what it holds."""
    try:
        if not path.is_symlink():
            return None
        target = os.path.realpath(path)
    except OSError:  # swapped for a file as it was resolved (EINVAL): the next scan looks again
        return CHANGED_WHILE_READ
    if not os.path.exists(target):
        return "a symbolic link to nothing: skipped"
    root = os.path.realpath(directory)
    if os.path.commonpath([root, target]) != root:
        return "a symbolic link to a file outside clusters_dir: not read (only files inside the directory are)"
    return None


def _naming(cluster: AnyClusterConfig | None) -> str:
    return f": cluster {one_line(cluster.name)!r}" if cluster is not None else ""


def with_cluster_dir(config: Config) -> tuple[Config, tuple[ClusterFile, ...]]:
    """``config`` with its clusters_dir's clusters, read once now (for the one-shot commands),
    and every file's standing."""
    if config.clusters_dir is None:
        return config, ()
    cluster_dir = ClusterDir(config.clusters_dir)
    cluster_dir.scan({c.name for c in config.clusters})
    return config.model_copy(update={"clusters": (*config.clusters, *cluster_dir.clusters)}), cluster_dir.files
