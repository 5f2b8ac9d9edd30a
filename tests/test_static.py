"""The package passes ruff and mypy --strict: part of the test command so CI enforces it."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("tool,args", [
    ("ruff", ["check", "daemon", "tests", "bench"]),
    ("mypy", []),  # configured in setup.cfg: strict on daemon/lagwatch
])
def test_static_checks(tool: str, args: list[str]) -> None:
    if shutil.which(tool) is None and tool != "mypy":
        pytest.fail(f"{tool} is not installed (pip install -e '.[test]')")
    cmd = [sys.executable, "-m", tool, *args]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
