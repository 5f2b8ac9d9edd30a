"""Port picks (demo/ports.py): a port handed out is not handed out again for HOLD seconds,
by this process or another sharing the notes."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import time
from pathlib import Path

import pytest
from lagwatch.demo import ports
from lagwatch.demo.ports import HOLD, claim, free_port


def test_a_claimed_port_is_held_then_released(tmp_path: Path) -> None:
    notes = tmp_path / "ports"
    assert claim(40001, 1000.0, notes)
    assert not claim(40001, 1000.0 + HOLD - 1, notes)  # held
    assert claim(40002, 1000.5, notes)  # another port is not
    assert claim(40001, 1000.0 + HOLD + 1, notes)  # released, and claimed afresh
    assert not claim(40001, 1000.0 + HOLD + 2, notes)


def test_notes_that_cannot_be_read_do_not_stop_a_pick(tmp_path: Path) -> None:
    (tmp_path / "garbage").write_text("not a port\n40001\n40001 soon\n")
    assert claim(40001, 5.0, tmp_path / "garbage")
    assert (tmp_path / "garbage").read_text() == "40001 5.0\n"
    (tmp_path / "elsewhere").symlink_to(tmp_path / "target")
    assert claim(40001, 5.0, tmp_path / "elsewhere")  # a symlink is not followed: no note
    assert not (tmp_path / "target").exists()


def test_notes_that_are_not_a_plain_file_of_this_users_are_left_alone(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert claim(40001, 5.0, fifo) and claim(40001, 5.0, fifo)  # not read (it would block): no note
    linked = tmp_path / "linked"
    linked.write_text("")
    os.link(linked, tmp_path / "second-name")
    assert claim(40001, 5.0, linked) and linked.read_text() == ""  # a hard link: not written
    if os.geteuid() == 0:  # another user's file, made first under a shared temp dir
        theirs = tmp_path / "theirs"
        theirs.write_text("40001 5.0\n")
        os.chown(theirs, 65534, 65534)
        assert claim(40001, 5.0, theirs) and theirs.read_text() == "40001 5.0\n"


def test_notes_locked_too_long_are_gone_without(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "LOCK_WAIT", 0.05)
    notes = tmp_path / "ports"
    with open(notes, "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        started = time.monotonic()
        assert claim(40001, 5.0, notes) and claim(40001, 5.0, notes)
        assert time.monotonic() - started < 2.0
    assert claim(40001, 5.0, notes) and not claim(40001, 5.0, notes)  # unlocked: noted


def _claims(notes: str, ports: list[int], out: multiprocessing.Queue[list[int]]) -> None:
    out.put([p for p in ports if claim(p, 100.0, Path(notes))])


def test_two_processes_claiming_the_same_ports_get_each_once(tmp_path: Path) -> None:
    notes, ports = str(tmp_path / "ports"), list(range(41000, 41400))
    out: multiprocessing.Queue[list[int]] = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_claims, args=(notes, ports, out)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    assert sorted(got[0] + got[1]) == ports  # every port to exactly one of them


def test_free_ports_picked_in_a_row_differ() -> None:
    picks = [free_port(["127.0.0.1"]) for _ in range(20)]
    assert len(set(picks)) == 20
