"""The atomic file replacement every file-writing pooler adapter uses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lagwatch.files import write_atomically


def test_replaces_whole_and_keeps_mode(tmp_path: Path) -> None:
    path = tmp_path / "pool.ini"
    path.write_text("old\n")
    path.chmod(0o640)
    write_atomically(path, "new\n")
    assert path.read_text() == "new\n"
    assert path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["pool.ini"]  # no temp file left behind


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_keeps_owner_and_group(tmp_path: Path) -> None:
    """Run as root, lagwatch must not hand the pooler's file over to root: a PgBouncer that
    reads it as its own user (mode 0640) would stop seeing it."""
    path = tmp_path / "pool.ini"
    path.write_text("old\n")
    os.chown(path, 65534, 65534)
    write_atomically(path, "new\n")
    assert (path.stat().st_uid, path.stat().st_gid) == (65534, 65534)


def test_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "pool.ini"
    path.write_text("old\n")
    with pytest.raises(TypeError):
        write_atomically(path, None)  # type: ignore[arg-type]
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["pool.ini"]
