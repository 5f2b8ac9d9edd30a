"""The Debian package (deploy/debian/build.sh), built from this checkout and installed on
this machine with apt-get, then upgraded, removed and purged, as an operator would.

This machine runs no systemd: what the maintainer scripts ask of it is recorded by stand-ins
for ``systemctl``, ``deb-systemd-invoke`` and ``deb-systemd-helper`` (the real ones diverted
aside for the test; each stand-in logs its arguments and succeeds), the units are checked
by ``systemd-analyze verify``, and the installed lagwatch is started by hand as the unit
starts it (as the ``lagwatch`` user, ``run -c /etc/lagwatch/lagwatch.yaml``, its environment
from /etc/lagwatch/lagwatch.env) against the run's real cluster, logged in to as the role the shipped SQL creates (WAL
dating granted). The package is purged at the end whatever happened.

What is tested does not depend on the PostgreSQL version: one runs these.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prebuilt
import pytest
import yaml
from chaoscluster import ChaosCluster
from harness import ROOT, LagwatchHttp, Readings, Writer
from test_least_privilege import config_as_lagwatch, drop_role

pytestmark = [pytest.mark.one_pg_version,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("apt-get") is None,
                                 reason="installs a package: needs root and apt-get")]

ETC = Path("/etc/lagwatch")
STATE = Path("/var/lib/lagwatch")
POOLER_DIR = Path("/etc/pgbouncer/lagwatch")
VENV = Path("/usr/lib/lagwatch")
SYSTEMD_TOOLS = ("/usr/bin/systemctl", "/usr/bin/deb-systemd-invoke", "/usr/bin/deb-systemd-helper")
STAND_IN = """#!/bin/sh
echo "$(basename "$0") $*" >> {log}
exit 0
"""


# The installed lagwatch sees what a shell on the host would: nothing of the test's own
# Python (its PYTHONPATH would import the checkout's lagwatch instead of the package's).
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def run(*argv: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, f"{' '.join(argv)}: {result.stdout}{result.stderr}"
    return result


@pytest.fixture(scope="module")
def built() -> tuple[Path, Path]:
    """The package built from this tree's wheel, and the same tree with its version bumped
    (the upgrade; repacked, not rebuilt, so that the two differ in their version only):
    built in the background early in the session (prebuilt.py)."""
    builds = prebuilt.builds()
    print(builds.step("deb").check().output.strip())
    builds.step("repack").check()
    return builds.deb(prebuilt.DEB_VERSION), builds.deb(prebuilt.UPGRADE_VERSION)


def installed() -> bool:
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "lagwatch"], capture_output=True, text=True)
    return status.returncode == 0 and "installed" in status.stdout


@pytest.fixture
def apt(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """apt-get's environment, with the systemd tools the maintainer scripts call replaced by
    stand-ins that log their arguments (dpkg-divert moves the real ones aside: dpkg runs
    maintainer scripts with a PATH of its own), and that log; afterwards the package is
    purged and the real tools put back, whatever the test did."""
    if installed():
        pytest.fail("lagwatch is already installed on this machine: the test would not leave it as it found it")
    log = tmp_path / "systemd-calls.log"
    log.touch()
    log.chmod(0o666)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    diverted: list[str] = []
    try:
        for tool in SYSTEMD_TOOLS:
            run("dpkg-divert", "--local", "--rename", "--divert", f"{tool}.lagwatch-test", "--add", tool)
            diverted.append(tool)
            Path(tool).write_text(STAND_IN.format(log=log))
            Path(tool).chmod(0o755)
        yield env, log
    finally:
        subprocess.run(["apt-get", "purge", "-y", "-q", "lagwatch"], capture_output=True, env=env, timeout=300)
        for tool in diverted:
            Path(tool).unlink(missing_ok=True)
            subprocess.run(["dpkg-divert", "--local", "--rename", "--remove", tool], capture_output=True, timeout=60)


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def owner(path: Path) -> tuple[str, int]:
    stat = path.stat()
    return pwd.getpwuid(stat.st_uid).pw_name, stat.st_mode & 0o7777


class Installed:
    """The installed lagwatch, started by hand as lagwatch.service starts it."""

    def __init__(self, port: int, log: Path) -> None:
        env_file = {k: v for k, v in (line.split("=", 1) for line in (ETC / "lagwatch.env").read_text().splitlines()
                                      if line and not line.startswith("#"))}
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            ["runuser", "-u", "lagwatch", "--", "/usr/bin/lagwatch", "run", "-c", str(ETC / "lagwatch.yaml")],
            stdout=self.log, stderr=subprocess.STDOUT, cwd="/",
            env={**HOST_ENV, "PYTHONUNBUFFERED": "1", **env_file})
        self.http = LagwatchHttp(port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(20)
        self.log.close()


def test_install_run_upgrade_remove_purge(built: tuple[Path, Path], apt: tuple[dict[str, str], Path],
                                          pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    first, second = built
    env, systemd_log = apt

    # Install: everything in place, owned and moded as the unit needs; nothing started.
    run("apt-get", "install", "-y", "-q", str(first), env=env)
    assert "exec /usr/lib/lagwatch/bin/python3 -m lagwatch.cli" in Path("/usr/bin/lagwatch").read_text()
    assert owner(ETC / "lagwatch.env") == ("root", 0o600)
    assert owner(ETC / "lagwatch.yaml")[1] == 0o640 and (ETC / "lagwatch.yaml").stat().st_gid == \
        pwd.getpwnam("lagwatch").pw_gid
    assert owner(STATE) == ("lagwatch", 0o750) and owner(POOLER_DIR) == ("lagwatch", 0o755)
    assert pwd.getpwnam("lagwatch").pw_shell == "/usr/sbin/nologin"
    share = Path(run("/usr/bin/lagwatch", "share-dir", env=HOST_ENV).stdout.strip())
    assert (share / "deploy" / "sql" / "lagwatch-role.sql").exists()
    assert (share / "dashboards" / "lagwatch.json").exists()
    assert Path("/usr/share/lagwatch").resolve() == share.resolve()
    run("/usr/bin/lagwatch", "validate", "-c", str(ETC / "lagwatch.yaml"), env=HOST_ENV)  # the example, as shipped
    for unit in ("lagwatch.service", "lagwatch@.service"):
        text = (Path("/lib/systemd/system") / unit).read_text()
        assert "ExecStart=/usr/bin/lagwatch run -c /etc/lagwatch/" in text
    verify = subprocess.run(["systemd-analyze", "verify", "/lib/systemd/system/lagwatch.service"],
                            capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert not [c for c in calls(systemd_log) if any(w in c.split() for w in ("start", "enable", "restart",
                                                                              "try-restart"))], calls(systemd_log)

    # Configured as README.Debian says (the role from the shipped SQL, the config edited,
    # a password line in lagwatch.env), run as the unit runs it.
    primary = pg_cluster.primary
    drop_role(primary)
    psql = str(pg_cluster.binaries.tool("psql"))
    run(psql, "-X", "-v", "ON_ERROR_STOP=1", "-h", primary.host, "-p", str(primary.port), "-U", "postgres",
        "-d", "postgres", "-f", str(share / "deploy" / "sql" / "lagwatch-role.sql"))
    pg_cluster.wait_replayed()
    config: dict[str, Any] = config_as_lagwatch(pg_cluster)
    config["state_dir"] = str(STATE)
    (ETC / "lagwatch.yaml").write_text(yaml.safe_dump(config))
    with (ETC / "lagwatch.env").open("a") as env_file:
        env_file.write("LAGWATCH_TEST_MARK=kept\n")
    (POOLER_DIR / "lagwatch.ini").write_text("[databases]\n; lagwatch's include file, as it last wrote it\n")
    port = int(config["listen"].rsplit(":", 1)[1])
    daemon = Installed(port, tmp_path / "installed-lagwatch.log")
    try:
        daemon.http.wait_for("the installed lagwatch up on every node", lambda: all(
            _value(daemon.http, "lagwatch_up", node=n) == 1 for n in ("primary", "replica1", "replica2")), 60)
        with Writer(pg_cluster), Readings(daemon.http) as readings:
            pg_cluster.replicas[0].pause_replay()
            daemon.http.wait_for("replica1 dated by the WAL (the role's grants)", lambda: any(
                r.evidence == "wal_commit" and r.seconds > 0 for r in readings.of("replica1")), 30)
            pg_cluster.replicas[0].resume_replay()
        assert _user_of(daemon.proc.pid) == "lagwatch"
    finally:
        daemon.stop()
    # Whatever the daemon wrote under /var/lib/lagwatch is state: an upgrade keeps it.
    kept = {p: digest(p) for p in (ETC / "lagwatch.yaml", ETC / "lagwatch.env", POOLER_DIR / "lagwatch.ini",
                                   *(f for f in STATE.rglob("*") if f.is_file()))}

    # Upgrade: config, secrets, state and the include file as they were; restarted only if
    # running (try-restart: systemctl's "if it is running").
    run("apt-get", "install", "-y", "-q", str(second), env=env)
    assert run("dpkg-query", "-W", "-f=${Version}", "lagwatch").stdout == prebuilt.UPGRADE_VERSION
    assert {p: digest(p) for p in kept} == kept
    assert "deb-systemd-invoke try-restart lagwatch.service lagwatch@*.service" in calls(systemd_log)
    assert not [c for c in calls(systemd_log) if c.split()[1:2] in (["start"], ["enable"], ["restart"])]

    # Remove: stopped and disabled, config kept, the program gone.
    run("apt-get", "remove", "-y", "-q", "lagwatch", env=env)
    assert "deb-systemd-invoke stop lagwatch.service lagwatch@*.service" in calls(systemd_log)
    assert "deb-systemd-helper disable lagwatch.service" in calls(systemd_log)
    assert (ETC / "lagwatch.yaml").exists() and digest(ETC / "lagwatch.yaml") == kept[ETC / "lagwatch.yaml"]
    assert not VENV.exists() and not Path("/usr/bin/lagwatch").exists()

    # Purge: config, state and what lagwatch wrote gone; the user kept; nothing running.
    run("apt-get", "purge", "-y", "-q", "lagwatch", env=env)
    for gone in (ETC, STATE, POOLER_DIR, VENV, Path("/lib/systemd/system/lagwatch.service"), Path("/usr/bin/lagwatch")):
        assert not gone.exists(), gone
    assert pwd.getpwnam("lagwatch")  # Debian's convention: the system user stays
    owned = subprocess.run(["find", "/etc", "/var", "/usr", "/opt", "-xdev", "-user", "lagwatch"],
                           capture_output=True, text=True, timeout=120).stdout.split()
    assert owned == [], owned
    assert subprocess.run(["pgrep", "-u", "lagwatch"], capture_output=True).returncode == 1
    listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout
    assert listening.strip() == "", listening


def _value(http: LagwatchHttp, name: str, **labels: str) -> float | None:
    try:
        return http.value(name, **labels)
    except OSError:
        return None


def _user_of(pid: int) -> str:
    """The user of runuser's child: the process lagwatch runs in."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    target = int(children[0]) if children else pid
    return pwd.getpwuid(Path(f"/proc/{target}").stat().st_uid).pw_name


def test_lintian_finds_no_error_and_every_warning_is_overridden_with_a_reason(built: tuple[Path, Path]) -> None:
    """lintian with every override ignored: no error at all (so none is overridden), and
    each warning's tag overridden in deploy/debian/lintian-overrides (the package's
    /usr/share/lintian/overrides/lagwatch) under a comment that says why."""
    lines = prebuilt.builds().step("lintian").output.splitlines()
    assert not [line for line in lines if line.startswith("E:")], "\n".join(lines)
    warned = {line.split()[2] for line in lines if line.startswith("W:")}
    overrides = (ROOT / "deploy" / "debian" / "lintian-overrides").read_text().splitlines()
    tags = {}
    for n, line in enumerate(overrides):
        if line.strip() and not line.startswith("#"):
            assert n > 0 and overrides[n - 1].startswith("#"), f"an override without its reason: {line}"
            tags[line.split()[0].removeprefix("lagwatch:").strip() or line.split()[1]] = line
    assert warned <= set(tags), f"warnings not overridden: {sorted(warned - set(tags))}\n" + "\n".join(lines)
    assert set(tags) <= warned, f"overrides of nothing lintian says: {sorted(set(tags) - warned)}"
