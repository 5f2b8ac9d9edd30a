"""The ``command`` pooler: render a text template into a file, then run a reload command.

For poolers lagwatch has no adapter for. The template is a Python ``str.format`` string
with three placeholders, all sorted so that an unchanged pool renders byte-identically:

* ``{members}``: the member names separated by spaces (``primary replica1``),
* ``{hosts}``: their hosts separated by commas (``10.0.0.2,10.0.0.3``),
* ``{backends}``: one ``name host:port`` line per member, by name (port 5432 if the DSN
  names none).

A template's output cannot be parsed back, so after every successful reload the applied
member list is kept in a sidecar file ``<output_file>.members`` (JSON, written atomically,
with a hash of the output it describes). ``read_pool`` reads that sidecar: with no sidecar,
or when the output file no longer matches it (edited by hand, or a crash between the two
writes), the pool is unknown and ``read_pool`` raises, so the daemon converges by applying.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import IO

from lagwatch.config import CommandPoolerConfig
from lagwatch.files import write_atomically
from lagwatch.poolers.base import READ_BACK_EVERY, Backend, NeverAppliedError, PoolerError

DEFAULT_PORT = 5432
_STDERR_TAIL = 600  # characters of a failed reload command's stderr kept in the error


def run_reload(argv: Sequence[str], timeout: float) -> None:
    """Run ``argv`` (no shell) and raise PoolerError unless it exits 0 within ``timeout``.

    The error carries the tail of the command's stderr. Only ``argv[0]`` is named in it, as
    the arguments may hold secrets. An empty ``argv`` means "nothing to run". The command
    runs in its own session and on timeout its whole process group is killed; stderr goes
    to a temporary file so a background child holding it open cannot make this hang.
    """
    if not argv:
        return
    name = argv[0]
    with tempfile.TemporaryFile() as errfile:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=errfile, start_new_session=True)
        except OSError as exc:
            raise PoolerError(f"reload command {name!r} could not be started: {exc.strerror or exc}") from None
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            raise PoolerError(f"reload command {name!r} timed out after {timeout:g}s{_tail(errfile)}") from None
        if returncode != 0:
            how = f"was killed by signal {-returncode}" if returncode < 0 else f"exited with status {returncode}"
            raise PoolerError(f"reload command {name!r} {how}{_tail(errfile)}")


def _tail(errfile: IO[bytes]) -> str:
    """``": <last part of stderr>"`` or ``""`` when it printed nothing."""
    errfile.seek(0, os.SEEK_END)
    size = errfile.tell()
    errfile.seek(max(0, size - 4 * _STDERR_TAIL))
    text = errfile.read().decode("utf-8", "replace").strip()
    if not text:
        return ""
    if len(text) > _STDERR_TAIL:
        text = "..." + text[-_STDERR_TAIL:]
    return f": {text}"


def read_text(path: Path) -> str | None:
    """The file's exact text (CRLF kept), or None if it does not exist."""
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise PoolerError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise PoolerError(f"cannot read {path}: {exc.strerror or exc}") from None


def write_text(path: Path, text: str) -> None:
    """``write_atomically`` with OS errors turned into PoolerError."""
    try:
        write_atomically(path, text)
    except OSError as exc:
        raise PoolerError(f"cannot write {path}: {exc.strerror or exc}") from None


def restore(path: Path, previous: str | None, error: PoolerError) -> PoolerError:
    """Put ``previous`` back in ``path`` (remove the file if there was none) after ``error``;
    returns the error to raise, which also says whether the restore failed."""
    try:
        if previous is None:
            path.unlink(missing_ok=True)
        else:
            write_atomically(path, previous)
    except OSError as exc:
        return PoolerError(f"{error}; restoring the previous {path} failed too: {exc.strerror or exc}")
    return PoolerError(f"{error} (previous {path} restored)")


def render(template: str, members: Collection[str], backends: Mapping[str, Backend]) -> str:
    """The template filled in for ``members`` (pure; sorted, so stable for a given set)."""
    unknown = sorted(set(members) - set(backends))
    if unknown:
        raise PoolerError(f"no host known for member(s) {', '.join(unknown)}")
    names = sorted(set(members))
    chosen = [backends[name] for name in names]
    # The template was checked when the config loaded (config.check_template).
    return template.format(
        members=" ".join(names),
        hosts=",".join(sorted(b.host for b in chosen)),
        backends="\n".join(f"{b.name} {b.host}:{b.port or DEFAULT_PORT}" for b in chosen),
    )


class CommandPooler:
    """Render ``template`` into ``output_file`` and run ``reload_command``."""

    kind = "command"
    read_back_every = READ_BACK_EVERY

    def __init__(self, config: CommandPoolerConfig, backends: Mapping[str, Backend], timeout: float = 10.0) -> None:
        self.config = config
        self.backends = dict(backends)
        self.timeout = timeout

    @property
    def sidecar(self) -> Path:
        output = self.config.output_file
        return output.with_name(output.name + ".members")

    def routes_for(self, members: frozenset[str], current: frozenset[str] | None) -> frozenset[str]:
        return members

    def read_pool(self) -> frozenset[str]:
        output = self.config.output_file
        raw = read_text(self.sidecar)
        if raw is None:
            raise NeverAppliedError(f"{output}: pool unknown: never applied (no {self.sidecar.name})")
        try:
            state = json.loads(raw)
            members = state["members"]
            digest = state["output_sha256"]
            if not (isinstance(members, list) and all(isinstance(m, str) for m in members)
                    and isinstance(digest, str)):
                raise TypeError("members must be a list of names")
        except (ValueError, KeyError, TypeError) as exc:
            raise PoolerError(f"{self.sidecar}: pool unknown: unreadable ({exc})") from None
        current = read_text(output)
        if current is None or _sha256(current) != digest:
            raise PoolerError(f"{output}: pool unknown: the file changed since lagwatch wrote it")
        return frozenset(members)

    def apply_pool(self, members: frozenset[str]) -> None:
        output = self.config.output_file
        new = render(self.config.template, members, self.backends)
        old = read_text(output)
        if new == old:
            try:
                if self.read_pool() == members:
                    return  # already applied: no write, no reload
            except PoolerError:
                pass
            # Right content but no record that the pooler loaded it: reload, then record it.
            run_reload(self.config.reload_command, self.timeout)
        else:
            write_text(output, new)
            try:
                run_reload(self.config.reload_command, self.timeout)
            except PoolerError as exc:
                raise restore(output, old, exc) from None
        state = {"members": sorted(members), "output_sha256": _sha256(new)}
        write_text(self.sidecar, json.dumps(state) + "\n")
        got = self.read_pool()
        if got != members:
            raise PoolerError(f"{output}: after apply the pool is {sorted(got)}, wanted {sorted(members)}")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
