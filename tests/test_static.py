"""The package passes ruff, mypy --strict and its import-linter layer contract (setup.cfg):
part of the test command so CI enforces it."""

import os
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


def test_imports_point_down() -> None:
    """The contracts in setup.cfg ([importlinter]): the stages of a cycle (sources, read,
    estimate, act, serve) each import only the ones below them, config at the bottom and
    the daemon and cli on top; inside estimate, the tracker on top; nothing the daemon runs
    imports the demo. Checked on this checkout's code."""
    lint = shutil.which("lint-imports")
    if lint is None:
        pytest.fail("lint-imports is not installed (pip install -e '.[test]')")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "daemon")}
    result = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = (ROOT / "setup.cfg").read_text().count("[importlinter:contract:")
    assert f"Contracts: {contracts} kept, 0 broken." in result.stdout, result.stdout


def test_the_daemon_runs_without_the_demo() -> None:
    """The demo's room (lagwatch.demo: a local cluster, its PgBouncer, the binaries) is not
    loaded by what `lagwatch run` loads."""
    code = "import sys, lagwatch.runner; assert not [m for m in sys.modules if m.startswith('lagwatch.demo')]"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "daemon")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr


def test_functions_and_modules_stay_small() -> None:
    """No function of cyclomatic complexity D or worse (radon), no module over 400 lines:
    a module that grows past that has taken on a second job."""
    result = subprocess.run([sys.executable, "-m", "radon", "cc", "-s", "-n", "D", "daemon/lagwatch"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "", result.stdout + result.stderr
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "daemon" / "lagwatch").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}, long
