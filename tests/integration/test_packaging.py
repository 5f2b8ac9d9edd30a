"""From the files git tracks in this checkout (their working-tree contents, so uncommitted
edits count; nothing gitignored such as a stale daemon/lagwatch.egg-info can leak in):
build the sdist and, from it, the wheel; install the wheel into a fresh venv; `pip install .`
into another; the shipped files are there and `lagwatch validate` accepts the example. The
builds and `pip install .` run in the background early in the session (prebuilt.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import prebuilt
import pytest
import yaml
from config_corpus import uncommented

SHARED = ("dashboards/lagwatch.json", "alerts/lagwatch.rules.yml", "alerts/alertmanager.example.yml",
          "deploy/lagwatch.example.yaml", "deploy/systemd/lagwatch.service", "deploy/systemd/lagwatch@.service",
          "deploy/sql/lagwatch-role.sql", "deploy/prometheus/prometheus.yml")


def run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, cwd=cwd)
    assert result.returncode == 0, f"{argv}: {result.stdout[-3000:]}{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def builds() -> prebuilt.Builds:
    """The copy of the tracked files and what was built from it (prebuilt.py)."""
    if shutil.which("git") is None:
        pytest.skip("git is missing: the packaging test builds from the files git tracks")
    made = prebuilt.builds()
    try:
        made.step("source")  # the tracked files copied, none gitignored
    except AssertionError as error:
        if isinstance(error.__cause__, prebuilt.NotAGitCheckoutError):
            pytest.skip(str(error.__cause__))
        raise
    return made


def fresh_venv(where: Path) -> Path:
    # The venv sees this interpreter's site-packages for the dependencies, so only lagwatch
    # itself is installed into it (no download of the dependencies needed).
    run(sys.executable, "-m", "venv", "--system-site-packages", where)
    return where / "bin" / "python"


def check_installed(venv: Path, workdir: Path) -> Path:
    """The lagwatch in ``venv`` is the installed one, with its shared files; returns share-dir."""
    lagwatch = venv / "bin" / "lagwatch"
    version = run(lagwatch, "--version", cwd=workdir).stdout
    assert re.fullmatch(r"lagwatch \d+\.\d+\.\d+\S*\n", version), version
    share = Path(run(lagwatch, "share-dir", cwd=workdir).stdout.strip())
    assert share.is_relative_to(venv), share
    for shipped in SHARED:
        assert (share / shipped).is_file(), shipped
    assert list((share / "alerts" / "runbooks").glob("*.md"))
    out = run(lagwatch, "validate", "-c", share / "deploy" / "lagwatch.example.yaml", cwd=workdir)
    assert "ok (1 cluster(s), 2 replica(s))" in out.stdout
    # The package imported is the venv's, not this checkout.
    where = run(venv / "bin" / "python", "-c", "import lagwatch; print(lagwatch.__file__)", cwd=workdir).stdout
    assert where.strip().startswith(str(venv)), where
    return share


def test_sdist_wheel_venv(tmp_path: Path, builds: prebuilt.Builds) -> None:
    tracked, dist = builds.tracked, builds.dist
    # python -m build made the sdist, then the wheel from that sdist: both must work.
    builds.step("build").check()
    (wheel,) = dist.glob("lagwatch-*.whl")
    (sdist,) = dist.glob("lagwatch-*.tar.gz")
    with tarfile.open(sdist) as tar:
        members = [m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile() and "/" in m.name]
        egg_info = next(m for m in tar.getmembers() if m.name.endswith(".egg-info/SOURCES.txt"))
        extracted = tar.extractfile(egg_info)
        assert extracted is not None
        sources = extracted.read().decode().split()
    for shipped in ("alerts/lagwatch.rules.yml", "dashboards/lagwatch.json", "deploy/systemd/lagwatch.service",
                    "deploy/lagwatch.example.yaml"):
        assert shipped in members, shipped
    # Nothing but tracked files and what setuptools generates (PKG-INFO, the egg-info).
    generated = {"PKG-INFO"}
    stray = [m for m in members if m not in tracked and m not in generated and ".egg-info/" not in m]
    assert not stray, stray
    stray_sources = [s for s in sources if s not in tracked and ".egg-info/" not in s]
    assert not stray_sources, stray_sources
    # The wheel ships the product: no test harness (clusters to freeze, cut off, promote).
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        files = zf.namelist()
        starter = {name: zf.read(f"lagwatch/demo/{name}").decode() for name in ("cluster.py", "servers.py",
                                                                                   "binaries.py")}
    assert not [f for f in files if f.startswith("tests/") or "chaoscluster" in f or "oracle" in f], files
    for test_only in ("def freeze", "def cut_off", "def promote", "def heal", "def rebuild_replica",
                      "def restore_auto_conf", "_proc_table", "shmctl"):
        assert not [name for name, code in starter.items() if test_only in code], test_only
    print("the demo's cluster starter: " + ", ".join(f"{name} {code.count(chr(10))} lines"
                                                      for name, code in starter.items()))
    print(f"wheel: {wheel.name}, {wheel.stat().st_size / 1024:.0f} KiB, {len(files)} files")

    venv = tmp_path / "wheel-venv"
    python = fresh_venv(venv)
    run(python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", wheel)
    share = check_installed(venv, tmp_path)

    # Every optional setting of the example switched on still validates; the PgBouncer
    # include file sits in the folder the units let lagwatch write.
    example = (share / "deploy" / "lagwatch.example.yaml").read_text()
    full = uncommented(example)
    assert full != example
    # The web config it names is read at validation, as run reads it: one that exists.
    assert "web_config_file: /etc/lagwatch/web.yml" in full
    (tmp_path / "web.yml").write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    full = full.replace("/etc/lagwatch/web.yml", str(tmp_path / "web.yml"))
    (tmp_path / "full.yaml").write_text(full)
    assert "ok" in run(venv / "bin" / "lagwatch", "validate", "-c", tmp_path / "full.yaml", cwd=tmp_path).stdout
    cluster = yaml.safe_load(full)["clusters"][0]
    assert Path(cluster["pooler"]["include_file"]).parent == Path("/etc/pgbouncer/lagwatch")
    assert set(cluster["sla"]) == {"max_lag", "p95", "eject_after", "readmit_below", "readmit_after",
                                   "min_replicas", "fallback_to_primary"}, cluster["sla"]
    assert cluster["pooler"]["kind"] == "pgbouncer" and yaml.safe_load(full)["web_config_file"]
    for unit in ("lagwatch.service", "lagwatch@.service"):
        assert "ReadWritePaths=-/etc/pgbouncer/lagwatch\n" in (share / "deploy" / "systemd" / unit).read_text()
    assert "issue 4/4" not in example


def test_pip_install_from_the_checkout(tmp_path: Path, builds: prebuilt.Builds) -> None:
    # `pip install .` as the README's install guide says (build isolation: setuptools
    # comes from the package index, as on an operator's host), made by prebuilt.py.
    builds.step("pip_install").check()
    check_installed(builds.source_venv, tmp_path)
