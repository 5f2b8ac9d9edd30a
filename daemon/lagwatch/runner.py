"""Running the daemon: its HTTP server beside it, until SIGTERM. `lagwatch run` and the
demo both start lagwatch through here."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import ipaddress
import logging
import platform
import resource
import sys
from pathlib import Path

from lagwatch import __version__
from lagwatch.config import Config
from lagwatch.daemon import Daemon
from lagwatch.serve.sdnotify import Notifier
from lagwatch.serve.web import WebServer


def run_daemon(config: Config, config_path: Path | None, web_config_file: Path | None = None) -> int:
    """Run the daemon on a loaded ``config``; ``web_config_file`` (the command line's) is
    kept for reloads."""
    log = logging.getLogger("lagwatch")
    web_config = config.web
    daemon = Daemon(config, config_path, notifier=Notifier(), web_config_file=web_config_file)
    host, port = config.listen_address
    _raise_descriptor_limit()
    _fix_malloc_mmap_threshold()
    try:
        # Descriptors the HTTP server leaves for the pollers (one or two per node) and files.
        nodes = sum(1 + len(c.replicas) for c in config.clusters_with_nodes) + 8 * len(config.patroni_clusters)
        web = WebServer(host, port, daemon.holder, lambda: daemon.config, reserved_descriptors=64 + 2 * nodes)
    except OSError as exc:
        log.error("cannot listen on %s: %s", config.listen, exc.strerror)
        return 1
    daemon.reload_hooks.append(web.prepare_web_config)
    _tune_garbage_collection()
    _shorten_switch_interval()
    web.start()
    tls = web.tls
    scheme = "https" if tls else "http"
    log.info("lagwatch %s listening on %s://%s:%d/ (/metrics, /status)", __version__, scheme, host, web.port)
    if web_config is None:
        where = "loopback only" if _is_loopback(host) else "NOT loopback: anyone who can reach it can read it"
        (log.info if _is_loopback(host) else log.warning)(
            "no web_config_file: HTTP without TLS or authentication, %s", where)
    elif not web.settings.auth.enabled:
        log.warning("web config has no basic_auth_users: endpoints are not password protected")
    try:
        asyncio.run(daemon.run())
    finally:
        web.stop()
    return 0


def _raise_descriptor_limit() -> None:
    """A fleet holds a connection per node: 900 nodes do not fit a shell's usual soft limit
    of 1,024 descriptors (and the HTTP server's cap is what the pollers leave), while the
    hard limit is far higher. The soft limit is raised to the hard one, as Go's runtime does
    for every program; the systemd units set LimitNOFILE themselves."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or hard == resource.RLIM_INFINITY:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        logging.getLogger("lagwatch").debug("cannot raise the descriptor limit to %d: %s", hard, exc)


# glibc's mallopt parameter (malloc.h); no library wraps mallopt.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024


def _fix_malloc_mmap_threshold() -> bool:
    """glibc's malloc gives a block above its mmap threshold (128 KiB to start) a mapping
    of its own, unmapped when freed. But each such free raises the threshold to the freed
    size (up to 32 MiB), and from then on a fleet's multi-megabyte blocks (each cycle's
    /metrics text, its render) come from the heaps, whose freed space stays resident:
    300 x 3 nodes ran ~10 MB higher after five minutes (bench/fleet.py). Setting the
    threshold fixes it where it started (glibc turns the adjustment off). Only on glibc;
    True if it was set."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


def _tune_garbage_collection() -> None:
    """A cycle makes hundreds of short-lived objects per node, nearly all freed by reference
    counting; at CPython's default threshold (a young collection every 700 allocations,
    a full one every hundred) the cycle collector spent 14% of lagwatch's CPU on a 300-node
    fleet scanning the long-lived lag history. What is loaded by now stays (frozen: never
    scanned again), and collections come 30 times less often: 11% less CPU per node-cycle,
    measured (bench/fleet.py); cyclic garbage (a failed poll's traceback) is freed later."""
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


# CPython hands the GIL to a waiting thread after this long (5 ms by default).
SWITCH_INTERVAL = 0.0005


def _shorten_switch_interval() -> None:
    """The HTTP server answers on threads of its own while a fleet's cycle keeps the main
    thread busy in Python, and every step of an answer (accept, read, each write as the
    socket drains: a dozen or more a scrape) waits for the cycle's thread to give up the
    GIL, which CPython asks of it only after the switch interval. At the default 5 ms a
    ready /metrics took ~120 ms beside a busy thread, whatever its size; at 0.5 ms 10-16 ms,
    for ~3 % less work done by the busy thread while scrapes came without pause
    (bench/switch.py). The interval only matters while another thread waits for the GIL:
    between scrapes it costs the cycle nothing."""
    sys.setswitchinterval(SWITCH_INTERVAL)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
