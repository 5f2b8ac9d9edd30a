"""What `lagwatch run` sets up for itself before polling."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] in (resource.RLIM_INFINITY, 256),
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
