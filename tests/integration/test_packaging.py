"""From this checkout: build the sdist and, from it, the wheel; install the wheel into a
fresh venv; the shipped files are there and `lagwatch validate` accepts the example."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness import ROOT


def run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, cwd=cwd)
    assert result.returncode == 0, f"{argv}: {result.stdout[-3000:]}{result.stderr[-3000:]}"
    return result


def test_sdist_wheel_venv(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # python -m build makes the sdist, then the wheel from that sdist: both must work.
    run(sys.executable, "-m", "build", "--outdir", dist, ROOT)
    (wheel,) = dist.glob("lagwatch-*.whl")
    (sdist,) = dist.glob("lagwatch-*.tar.gz")
    listing = run("tar", "tzf", sdist).stdout
    for shipped in ("alerts/lagwatch.rules.yml", "dashboards/lagwatch.json", "deploy/systemd/lagwatch.service"):
        assert shipped in listing, shipped

    venv = tmp_path / "venv"
    # The venv sees this interpreter's site-packages for the dependencies, so only the
    # wheel itself is installed here (no download needed).
    run(sys.executable, "-m", "venv", "--system-site-packages", venv)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--force-reinstall", wheel)
    lagwatch = venv / "bin" / "lagwatch"
    assert run(lagwatch, "--version").stdout.startswith("lagwatch ")
    share = Path(run(lagwatch, "share-dir", cwd=tmp_path).stdout.strip())
    assert share.is_relative_to(venv), share
    for shipped in ("dashboards/lagwatch.json", "alerts/lagwatch.rules.yml", "alerts/alertmanager.example.yml",
                    "deploy/lagwatch.example.yaml", "deploy/systemd/lagwatch@.service", "deploy/sql/lagwatch-role.sql",
                    "deploy/prometheus/prometheus.yml"):
        assert (share / shipped).is_file(), shipped
    assert list((share / "alerts" / "runbooks").glob("*.md"))
    out = run(lagwatch, "validate", "-c", share / "deploy" / "lagwatch.example.yaml", cwd=tmp_path)
    assert "ok" in out.stdout
    # The installed package is the one in the venv, not this checkout.
    where = run(venv / "bin" / "python", "-c", "import lagwatch; print(lagwatch.__file__)", cwd=tmp_path).stdout
    assert where.strip().startswith(str(venv)), where
