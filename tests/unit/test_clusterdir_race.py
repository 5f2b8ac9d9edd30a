"""clusters_dir and a file swapped for a link out of it (issue 3/6 of round three, item 7):
the check of a file's name and its open are two steps, and a link swapped in between them
must still not be read. Deterministic (the swap made at the worst moment, right after the
check), then as an attacker would race it: a thread swapping a file between a regular file
and a link to a file outside, as fast as it can, while lagwatch scans.

``LAGWATCH_RACE_SECONDS`` sets the race's length (3 s by default; 30 s by hand)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lagwatch.errors import ConfigError
from lagwatch.sources import clusterdir
from lagwatch.sources.clusterdir import ClusterDir
from lagwatch.yamlfile import read_text

# A file outside that reads as a cluster (so that being read would show as a cluster named
# for it) and holds a secret (so that any excerpt of it would show).
OUTSIDE = "name: stolen\nprimary: {dsn: host=p}\nreplicas: []\n# root:$6$SecretSalt$secrethash:19000\n"
GOOD = "primary: {dsn: host=p}\nreplicas: [{name: r1, dsn: host=r1}]\n"

SWAPPER = """
import os, sys, time
folder, outside, seconds, counted = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
victim, regular, link = (os.path.join(folder, n) for n in ("east.yaml", ".regular", ".link"))
good = open(victim).read()
end, swaps = time.monotonic() + seconds, 0
while time.monotonic() < end:
    with open(regular, "w") as f:
        f.write(good)
    os.replace(regular, victim)
    os.symlink(outside, link)
    os.replace(link, victim)
    swaps += 2
open(counted, "w").write(str(swaps))
"""


def _folder(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "clusters.d"
    folder.mkdir()
    outside = tmp_path / "shadow"
    outside.write_text(OUTSIDE)
    return folder, outside


def test_a_file_read_inside_a_directory_is_never_one_outside_it(tmp_path: Path) -> None:
    """read_text with ``inside``: a link out of the directory, or a path through a linked
    folder that leads out, is refused before a byte is read; a link within is followed."""
    folder, outside = _folder(tmp_path)
    (folder / "good.yaml").write_text(GOOD)
    (folder / "out.yaml").symlink_to(outside)
    (folder / "in.yaml").symlink_to(folder / "good.yaml")
    (folder / "..data").symlink_to(tmp_path)  # a folder link that leads out (a ConfigMap's, gone wrong)
    assert read_text(folder / "in.yaml", inside=folder) == GOOD
    for path in (folder / "out.yaml", folder / "..data" / "shadow"):
        with pytest.raises(ConfigError) as refused:
            read_text(path, inside=folder)
        assert "outside the directory" in str(refused.value) and "Secret" not in str(refused.value)


def test_a_link_swapped_in_right_after_the_check_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """The swap at the worst moment: the name checked as a regular file, then replaced by a
    link to a file outside before it is opened. (Before the open was confined, the scan read
    the outside file and put its cluster, ``stolen``, in force.)"""
    folder, outside = _folder(tmp_path)
    victim = folder / "east.yaml"
    victim.write_text(GOOD)
    checked = clusterdir.link_refusal

    def check_then_swap(directory: Path, path: Path) -> str | None:
        refusal = checked(directory, path)
        if path == victim and not path.is_symlink():
            swapped = folder / ".swap"
            swapped.symlink_to(outside)
            os.replace(swapped, victim)
        return refusal

    monkeypatch.setattr(clusterdir, "link_refusal", check_then_swap)
    d = ClusterDir(folder)
    with caplog.at_level(logging.INFO, "lagwatch.sources.clusterdir"):
        d.scan()
    assert [c.name for c in d.clusters] == []
    (standing,) = d.files
    assert standing.error is not None and "Secret" not in standing.error, standing
    assert "Secret" not in caplog.text and "stolen" not in caplog.text


def test_racing_a_file_against_a_link_out_never_reads_outside(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A thread swaps ``east.yaml`` between a regular file and a link to a file outside as
    fast as it can while lagwatch scans the folder: no scan ever puts the outside file's
    cluster in force or shows a byte of it, and none fails (resolving a link that has just
    become a file again raised EINVAL out of the scan before)."""
    folder, outside = _folder(tmp_path)
    victim = folder / "east.yaml"
    victim.write_text(GOOD)
    seconds = float(os.environ.get("LAGWATCH_RACE_SECONDS", "3"))
    counted = tmp_path / "swaps"
    # Another process, as an attacker's would be (a thread here would take turns with the
    # scans for the interpreter lock); it stops by itself after the race, and is ended by
    # its PID should it not.
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(folder), str(outside), str(seconds), str(counted)])
    d = ClusterDir(folder)
    names: set[str] = set()
    scans = 0
    with caplog.at_level(logging.INFO, "lagwatch.sources.clusterdir"):
        try:
            end = time.monotonic() + seconds  # the race's length is the point: the clock bounds it
            while time.monotonic() < end:
                d.scan()
                scans += 1
                names.update(c.name for c in d.clusters)
                assert all(f.error is None or "Secret" not in f.error for f in d.files)
        finally:
            if swapper.poll() is None:
                swapper.wait(10)
    swaps = int(counted.read_text())
    print(f"{scans} scans against {swaps} swaps in {seconds:g} s")
    assert scans > 100 and swaps > 100, (scans, swaps)
    assert "stolen" not in names, names
    assert "Secret" not in caplog.text and "stolen" not in caplog.text
