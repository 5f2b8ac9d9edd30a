"""A scraper's answers timed on the wire: from its request's packet to the answer's last.

Prometheus's ``scrape_duration_seconds`` ends after it has parsed and stored what it
fetched, so for a fleet's series it is mostly Prometheus's own work (bench/static_target.py
shows it: a server that only copies bytes gets the same figure). What the target's answer
took, as Prometheus's own connection saw it, is on the loopback wire: tcpdump (Debian's
``tcpdump``; root) timestamps every packet to and from the target's port, and each answer is
the time from the packet carrying a request to the last packet carrying the answer's bytes,
before that connection's next request. Prometheus reads the whole body before it parses
(scrape/scrape.go, ``readResponse``), so its parsing is not in it; but it reads (and
inflates a gzip answer) as the bytes come, and once its receive window is full its reading
pace holds back the answer's last packets: that part is the scraper's, and the static twin's
row (a server that only copies bytes) is its floor.

Only headers are captured (``-s 128``, ``--immediate-mode``: each packet handed on at once);
packets the kernel dropped are counted and said. An answer still coming when the capture
stops is left out (fewer than 90 % of the bytes of that port's median answer).
"""

from __future__ import annotations

import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

# "1764390000.123456 IP 127.0.0.1.45678 > 127.0.0.1.9187: Flags [P.], seq 1:235, ..., length 234"
LINE = re.compile(r"^(\d+\.\d+) IP \S+?\.(\d+) > \S+?\.(\d+): .*?length (\d+)")


def available() -> bool:
    return shutil.which("tcpdump") is not None


class Answer(NamedTuple):
    began: float  # the request's packet, epoch seconds (tcpdump's -tt)
    took: float  # to the answer's last packet, s
    size: int  # the answer's bytes on the wire


@dataclass
class Answers:
    """Per target port: its answers, in the order their requests came."""

    by_port: dict[int, list[Answer]] = field(default_factory=dict)
    dropped: int = 0

    def since(self, port: int, began: float) -> list[float]:
        """The times of the answers to requests from ``began`` (epoch s) on."""
        return [a.took for a in self.by_port.get(port, []) if a.began >= began]


def answers(lines: list[str], ports: set[int]) -> Answers:
    """The answers in tcpdump's ``-tt -n`` lines: a payload to a target port opens a request
    on that connection (a second packet of the same request, before any answer byte, does
    not); each payload from the target on it moves the request's end; the next request, or
    the end of the capture, closes it."""
    out = Answers({port: [] for port in ports})
    # (target, client) -> [request's time, the answer's last packet's, its bytes so far]
    open_: dict[tuple[int, int], list[float]] = {}

    def close(conn: tuple[int, int]) -> None:
        began, ended, size = open_.pop(conn)
        if size:
            out.by_port[conn[0]].append(Answer(began, ended - began, int(size)))

    for line in lines:
        match = LINE.match(line)
        if match is None:
            continue
        at, src, dst, length = float(match[1]), int(match[2]), int(match[3]), int(match[4])
        if length == 0:
            continue
        if dst in ports:
            conn = (dst, src)
            if conn in open_ and not open_[conn][2]:
                continue  # more of the same request
            if conn in open_:
                close(conn)
            open_[conn] = [at, at, 0]
        elif src in ports and (src, dst) in open_:
            open_[src, dst][1] = at
            open_[src, dst][2] += length
    whole = {port: statistics.median(a.size for a in found) for port, found in out.by_port.items() if found}
    for conn in list(open_):  # the capture stopped: whole answers only
        if open_[conn][2] >= 0.9 * whole.get(conn[0], float("inf")):
            close(conn)
    for found in out.by_port.values():
        found.sort()
    return out


class WireClock:
    """tcpdump on the loopback for ``ports``, from ``start`` to ``stop`` (which returns the
    answers seen)."""

    def __init__(self, ports: set[int]) -> None:
        self.ports = ports
        self._folder = tempfile.TemporaryDirectory(prefix="lagwatch-wire-")
        self._out = Path(self._folder.name) / "packets.txt"
        self._err = Path(self._folder.name) / "tcpdump.err"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        expr = " or ".join(f"tcp port {port}" for port in sorted(self.ports))
        with self._out.open("wb") as out, self._err.open("wb") as err:
            self._proc = subprocess.Popen(["tcpdump", "-i", "lo", "-n", "-tt", "-l", "--immediate-mode",
                                           "-s", "128", "-B", "8192", expr], stdout=out, stderr=err)
        # tcpdump says "listening on lo" once its filter is in place: only then do packets count.
        for _ in range(100):
            if b"listening on" in self._err.read_bytes() or self._proc.poll() is not None:
                break
            time.sleep(0.05)
        if self._proc.poll() is not None:
            said = self._err.read_text(errors="replace").strip()
            self._folder.cleanup()
            raise RuntimeError(f"tcpdump did not start: {said}")

    def stop(self) -> Answers:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGINT)
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        try:
            found = answers(self._out.read_text(errors="replace").splitlines(), self.ports)
            dropped = re.search(r"(\d+) packets dropped by kernel", self._err.read_text(errors="replace"))
            found.dropped = int(dropped[1]) if dropped else 0
            return found
        finally:
            self._folder.cleanup()
