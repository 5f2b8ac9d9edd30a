"""Operator holds under concurrent CLI use, and a holds file or state_dir that is broken:
`lagwatch pool` as separate processes, as operators run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lagwatch
import pytest
from lagwatch.act.holds import HoldsError, HoldStore

REPLICAS = [f"r{i}" for i in range(10)]


def write_config(tmp_path: Path, state_dir: Path) -> Path:
    replicas = "".join(f"      - {{name: {r}, dsn: 'host=127.0.0.1 port=1'}}\n" for r in REPLICAS)
    config = tmp_path / "lagwatch.yaml"
    config.write_text(f"state_dir: {state_dir}\nclusters:\n  - name: main\n"
                      f"    primary: {{dsn: 'host=127.0.0.1 port=1'}}\n    replicas:\n{replicas}")
    return config


def pool(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lagwatch.cli", "pool", "-c", str(config), *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(lagwatch.__file__).parents[1])})


def test_ten_concurrent_holds_all_kept_and_concurrent_releases_all_stick(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path, state)
    with ThreadPoolExecutor(len(REPLICAS)) as executor:
        results = list(executor.map(lambda r: pool(config, "hold", r, "out"), REPLICAS))
    assert all(r.returncode == 0 and "held out" in r.stdout for r in results), results
    assert json.loads((state / "holds.json").read_text()) == {"main": {r: "out" for r in REPLICAS}}

    # Half released at once while the other half are turned around to "in".
    def change(replica: str) -> subprocess.CompletedProcess[str]:
        return pool(config, "release", replica) if int(replica[1:]) % 2 else pool(config, "hold", replica, "in")

    with ThreadPoolExecutor(len(REPLICAS)) as executor:
        results = list(executor.map(change, REPLICAS))
    assert all(r.returncode == 0 for r in results), results
    assert json.loads((state / "holds.json").read_text()) == {"main": {r: "in" for r in REPLICAS[::2]}}


def test_a_corrupt_holds_file_is_said_cleanly_and_release_all_repairs_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    config = write_config(tmp_path, state)
    (state / "holds.json").write_text('{"main": {"r1": "out"')  # cut off mid-write by hand
    for args in (("show",), ("hold", "r1", "out"), ("release", "r1")):
        result = pool(config, *args)
        assert "Traceback" not in result.stderr, result.stderr
        assert f"{state / 'holds.json'}: not valid JSON" in result.stdout + result.stderr, result
        assert "release --all" in result.stdout + result.stderr
        assert result.returncode == 2, (args, result)
    repaired = pool(config, "release", "--all")
    assert repaired.returncode == 0, repaired
    kept = list(state.glob("holds.json.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_text() == '{"main": {"r1": "out"', kept
    assert str(kept[0]) in repaired.stdout
    assert json.loads((state / "holds.json").read_text()) == {}
    assert pool(config, "hold", "r1", "out").returncode == 0
    assert pool(config, "release", "--all").stdout.strip() == "main: released r1 to automation"


@pytest.mark.parametrize("broken", ["a file", "unwritable"])
def test_a_bad_state_dir_is_said_cleanly(tmp_path: Path, broken: str) -> None:
    if broken == "a file":
        state = tmp_path / "state"
        state.write_text("not a directory\n")
    else:
        state = Path("/proc/lagwatch-state")  # cannot be created, even by root
    config = write_config(tmp_path, state)
    for args in (("hold", "r1", "out"), ("release", "r1"), ("release", "--all")):
        result = pool(config, *args)
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode == 2, (args, result)
        assert str(state) in result.stderr and "state_dir" in result.stderr, result.stderr
    shown = pool(config, "show")
    assert "Traceback" not in shown.stderr and shown.returncode in (0, 2), shown


def test_the_daemons_read_waits_for_a_writer_and_never_sees_half(tmp_path: Path) -> None:
    store = HoldStore(tmp_path / "holds.json")
    store.set("main", "r1", "out")
    assert store.for_cluster("main") == {"r1": "out"}
    (tmp_path / "holds.json").write_text("[]")
    with pytest.raises(HoldsError, match="expected"):
        store.load()
