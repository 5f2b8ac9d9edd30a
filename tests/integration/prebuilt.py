"""The package builds, started early in the session and run in the background.

Building what lagwatch ships takes two minutes of one core: the sdist and, from it, the
wheel (python -m build), ``pip install .`` into a venv, the Debian package from that wheel
(deploy/debian/build.sh: psycopg's C implementation compiled against Debian's libpq, a
minute by itself), its repack with a bumped version (the upgrade), and lintian on it. Run
in the background at nice 19 from the first test of the worker that runs the package
modules (with ``-n 0``: from the session's start, beside the unit tests that run first),
they cost the suite's clock almost nothing, where run in their tests they cost it two
minutes; the package modules run last in their group (tests/conftest.py). The tests then
assert on what each step made and said
(test_packaging.py, test_debian_package.py); a step that failed fails the tests that need
it, with its output.

Started only when a test that needs it was collected (the Debian package only where its
test can run: root, apt-get); a run that ends first stops it, its processes and files.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from harness import ROOT

DEB_VERSION, UPGRADE_VERSION = "0.0.1-1", "0.0.1-2"
MODULES = ("test_packaging.py", "test_debian_package.py")


class NotAGitCheckoutError(Exception):
    """The builds start from the files git tracks: the packaging tests skip without them."""


@dataclass(frozen=True)
class Step:
    argv: tuple[str, ...]
    returncode: int
    output: str
    seconds: float

    def check(self) -> Step:
        assert self.returncode == 0, f"{' '.join(self.argv)} (exit {self.returncode}):\n{self.output[-6000:]}"
        return self


class Builds:
    """The steps, one after another on a thread of their own; each test waits for the one
    it needs (``step``)."""

    NAMES = ("source", "build", "pip_install", "deb", "repack", "lintian")

    def __init__(self, deb: bool = True) -> None:
        self.deb_wanted = deb
        self.work = Path(tempfile.mkdtemp(prefix="lagwatch-prebuilt-"))
        self.src = self.work / "checkout" / "lagwatch"
        self.dist = self.work / "dist"
        self.deb_out = self.work / "deb"
        self.source_venv = self.work / "source-venv"
        self.tracked: set[str] = set()
        self._done = {name: threading.Event() for name in self.NAMES}
        self._steps: dict[str, Step | BaseException] = {}
        self._proc: subprocess.Popen[str] | None = None
        self._stopped = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="prebuilt", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def step(self, name: str, timeout: float = 900) -> Step:
        """The step's outcome, once it has run (an error of the thread's own is raised)."""
        assert self._done[name].wait(timeout), f"the background build's {name} step took over {timeout:.0f} s"
        outcome = self._steps[name]
        if isinstance(outcome, BaseException):
            raise AssertionError(f"the background build's {name} step failed") from outcome
        return outcome

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._proc is not None:
                _end_group(self._proc)
        self._thread.join(30)
        shutil.rmtree(self.work, ignore_errors=True)

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        steps = (("source", self._copy_source), ("build", self._build), ("pip_install", self._pip_install),
                 ("deb", self._deb), ("repack", self._repack), ("lintian", self._lintian))
        failed: BaseException | None = None
        for name, action in steps:
            try:
                if failed is not None:
                    raise RuntimeError("an earlier step failed") from failed
                if name in ("deb", "repack", "lintian") and not self.deb_wanted:
                    raise RuntimeError("the Debian package is not built here (its test cannot run)")
                self._steps[name] = action()
            except BaseException as error:  # said by the test that waits for it
                self._steps[name] = error
                if name in ("source", "build", "deb"):  # what the later steps build on
                    failed = error
            self._done[name].set()

    def _cmd(self, *argv: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> Step:
        args = tuple(str(a) for a in argv)
        started = time.monotonic()
        with self._lock:
            if self._stopped:
                raise RuntimeError("the session ended")
            # nice 19: the CPU the tests beside it leave idle. A session of its own: stopped,
            # the whole tree goes (gcc under pip under build.sh), not only the first process.
            proc = self._proc = subprocess.Popen(("nice", "-n", "19", *args), stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env,
                                                 start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            _end_group(proc)
            raise
        return Step(args, proc.returncode, output, time.monotonic() - started)

    def _copy_source(self) -> Step:
        """The files git tracks, as the working tree has them (uncommitted edits count;
        nothing gitignored, such as a stale egg-info, can leak in)."""
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, timeout=60)
        if listed.returncode != 0:
            said = listed.stderr.decode(errors="replace").strip()
            raise NotAGitCheckoutError(f"{ROOT} is not a git checkout: {said}")
        for name in (n for n in listed.stdout.decode().split("\0") if n):
            path = ROOT / name
            if not path.is_file() and not path.is_symlink():
                continue  # deleted in the working tree (not yet committed)
            (self.src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, self.src / name, follow_symlinks=False)
            self.tracked.add(name)
        # Checked before anything is built in the copy (python -m build writes an egg-info there).
        assert "setup.cfg" in self.tracked and "daemon/lagwatch/cli.py" in self.tracked
        assert not list(self.src.glob("daemon/*.egg-info")), "a gitignored egg-info was copied"
        return Step(("git", "ls-files"), 0, f"{len(self.tracked)} files", 0.0)

    def _build(self) -> Step:
        # python -m build makes the sdist, then the wheel from that sdist: both must work.
        return self._cmd(sys.executable, "-m", "build", "--outdir", self.dist, self.src).check()

    def _pip_install(self) -> Step:
        # `pip install .` as the README's install guide says (build isolation: setuptools
        # comes from the package index, as on an operator's host), into a venv that sees
        # this interpreter's site-packages for the dependencies.
        self._cmd(sys.executable, "-m", "venv", "--system-site-packages", self.source_venv).check()
        return self._cmd(self.source_venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", ".",
                         cwd=self.src)

    def _deb(self) -> Step:
        (wheel,) = self.dist.glob("lagwatch-*.whl")
        return self._cmd("bash", self.src / "deploy" / "debian" / "build.sh", env={
            **os.environ, "LAGWATCH_DEB_VERSION": DEB_VERSION, "LAGWATCH_DEB_OUT": str(self.deb_out),
            "LAGWATCH_DEB_WHEEL": str(wheel)}).check()

    def deb(self, version: str) -> Path:
        (found,) = self.deb_out.glob(f"lagwatch_{version}_*.deb")
        return found

    def _repack(self) -> Step:
        """The same tree with its version bumped (the upgrade): repacked, not rebuilt, so
        that the two differ in their version only."""
        first = self.deb(DEB_VERSION)
        tree = self.work / "tree"
        self._cmd("dpkg-deb", "-R", first, tree).check()
        control = tree / "DEBIAN" / "control"
        control.write_text(control.read_text().replace(f"Version: {DEB_VERSION}", f"Version: {UPGRADE_VERSION}"))
        second = self.deb_out / first.name.replace(DEB_VERSION, UPGRADE_VERSION)
        return self._cmd("dpkg-deb", "--root-owner-group", "--build", tree, second).check()

    def _lintian(self) -> Step:
        # Every override ignored: the test checks each warning against them itself. Exit 1
        # is lintian's "tags were emitted"; anything else is lintian failing to run.
        step = self._cmd("lintian", "--no-override", "--display-level", ">=warning", self.deb(DEB_VERSION))
        assert step.returncode in (0, 1) and step.output.strip(), f"lintian (exit {step.returncode}): {step.output}"
        return step


def _end_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to the step's whole process group (build.sh's trap removes its folder), then
    SIGKILL to what is left."""
    if proc.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def deb_test_can_run() -> bool:
    """test_debian_package.py's own condition: it installs a package."""
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


BUILDS: Builds | None = None


def start() -> None:
    global BUILDS
    if BUILDS is None:
        BUILDS = Builds(deb=deb_test_can_run())
        BUILDS.start()


def builds() -> Builds:
    """The session's builds (started now when nothing started them: a test run alone)."""
    start()
    assert BUILDS is not None
    return BUILDS


def stop() -> None:
    if BUILDS is not None:
        BUILDS.stop()
