"""What `lagwatch run` sets up for itself before polling."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] == resource.RLIM_INFINITY
                    or resource.getrlimit(resource.RLIMIT_NOFILE)[1] <= 256,
                    reason="needs a finite hard descriptor limit above 256")
def test_the_soft_descriptor_limit_is_raised_to_the_hard_one() -> None:
    """Started from a shell's low soft limit (in a child: the limit is per process)."""
    script = (
        "import resource\n"
        "from lagwatch.runner import _raise_descriptor_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "_raise_descriptor_limit()\n"
        "print(*resource.getrlimit(resource.RLIMIT_NOFILE), hard)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "daemon")}).stdout.split()
    soft, hard, expected = map(int, out)
    assert soft == hard == expected


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_freed_large_blocks_leave_resident_memory_only_without_the_fixed_threshold() -> None:
    """Each cycle's /metrics text is megabytes, made and freed: with glibc's moving mmap
    threshold the second one comes from the heap and stays resident once freed; with the
    threshold fixed, every one is unmapped when freed (in children: malloc is per process)."""
    script = (
        "import sys\n"
        "from lagwatch.runner import _fix_malloc_mmap_threshold\n"
        "def rss():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmRSS:'): return int(line.split()[1]) / 1024\n"
        "fixed = sys.argv[1] == 'fixed' and _fix_malloc_mmap_threshold()\n"
        "before = rss()\n"
        "for _ in range(4):\n"
        "    body = b'x' * (8 << 20)\n"
        "    del body\n"
        "print(fixed, rss() - before)\n"
    )

    def run(mode: str) -> tuple[str, float]:
        out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "daemon")}).stdout.split()
        return out[0], float(out[1])

    fixed, kept_fixed = run("fixed")
    moving, kept_moving = run("moving")
    assert fixed == "True" and moving == "False"
    assert kept_moving >= 6  # glibc's default: an 8 MiB block stays resident after its free
    assert kept_fixed < 2


def test_the_switch_interval_is_shortened_for_the_http_threads() -> None:
    """A ready answer's every step waits for the cycle's thread to give up the GIL: the
    daemon asks for it ten times sooner than CPython's 5 ms (bench/switch.py measures why)."""
    script = (
        "import sys\n"
        "from lagwatch.runner import SWITCH_INTERVAL, _shorten_switch_interval\n"
        "before = sys.getswitchinterval()\n"
        "_shorten_switch_interval()\n"
        "print(before, sys.getswitchinterval(), SWITCH_INTERVAL)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "daemon")}).stdout.split()
    before, after, wanted = map(float, out)
    assert before == pytest.approx(0.005)
    assert after == pytest.approx(wanted) == pytest.approx(0.0005)
