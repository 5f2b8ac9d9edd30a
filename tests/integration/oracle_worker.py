"""The lag oracle's hands, run as separate processes so that nothing in the test process
(scrapes, JSON parsing, the GIL) can stall a commit or a probe.

    python oracle_worker.py write DSN OUT RATE ON OFF SECONDS
        commits one row per transaction carrying a sequence number, RATE per second on an
        absolute schedule; with OFF > 0 it writes for ON seconds, is silent for OFF
        seconds, and so on. Logs "seq before after" per commit (monotonic seconds).
    python oracle_worker.py probe DSN OUT SECONDS
        reads the highest sequence number replayed, about every 2 ms. Logs "before after
        max_seq" per read.

Both stop by themselves after SECONDS, or when their stdin closes (the test is gone).
"""

from __future__ import annotations

import sys
import threading
import time

import psycopg

TABLE = "lagwatch_oracle"
PROBE_PERIOD = 0.002


def _watch_stdin(stop: threading.Event) -> None:
    sys.stdin.read()
    stop.set()


def write(dsn: str, out: str, rate: float, on: float, off: float, seconds: float, stop: threading.Event) -> None:
    period = 1.0 / rate
    with psycopg.connect(dsn, autocommit=True) as conn, open(out, "w", buffering=1) as log:
        seq = conn.execute(f"SELECT coalesce(max(seq), 0) FROM {TABLE}").fetchone()[0]  # type: ignore[index]
        started = time.monotonic()
        tick = 0
        while not stop.is_set():
            due = started + tick * period
            tick += 1
            if due - started > seconds:
                break
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if off > 0 and (due - started) % (on + off) >= on:
                continue  # silence
            seq += 1
            before = time.monotonic()
            conn.execute(f"INSERT INTO {TABLE} (seq) VALUES (%s)", (seq,))
            log.write(f"{seq} {before:.6f} {time.monotonic():.6f}\n")


def probe(dsn: str, out: str, seconds: float, stop: threading.Event) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, open(out, "w", buffering=1) as log:
        deadline = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            before = time.monotonic()
            row = conn.execute(f"SELECT coalesce(max(seq), 0) FROM {TABLE}").fetchone()
            log.write(f"{before:.6f} {time.monotonic():.6f} {row[0] if row else 0}\n")
            time.sleep(PROBE_PERIOD)


def main(argv: list[str]) -> None:
    stop = threading.Event()
    threading.Thread(target=_watch_stdin, args=(stop,), daemon=True).start()
    mode, dsn, out = argv[:3]
    if mode == "write":
        rate, on, off, seconds = (float(v) for v in argv[3:7])
        write(dsn, out, rate, on, off, seconds, stop)
    elif mode == "probe":
        probe(dsn, out, float(argv[3]), stop)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
