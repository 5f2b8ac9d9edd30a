"""Replacing a file so that its readers see the old one or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Write to a temp file beside ``path``, fsync, rename, fsync the directory: readers see
    the old file or the new one, never a partial one. Keeps the old file's mode, and its
    owner and group where this process may set them (root, or a group it belongs to), so
    a pooler that reads the file as another user still can."""
    directory = path.parent
    old = path.stat() if path.exists() else None
    mode = old.st_mode & 0o777 if old is not None else 0o644
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if old is not None:
            with contextlib.suppress(PermissionError):
                os.chown(tmp_name, old.st_uid if os.geteuid() == 0 else -1, old.st_gid)
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
