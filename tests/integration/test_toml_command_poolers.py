"""The PgCat/PgDog and command adapters against a real process that reloads on SIGHUP.

The "pooler" is a small Python child: on SIGHUP it re-reads the config file and appends
what it sees (the replica hosts, or the whole text for the command adapter) to a log.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lagwatch.config import CommandPoolerConfig, TomlPoolerConfig
from lagwatch.demo.servers import proc_state
from lagwatch.poolers import pgcat, pgdog
from lagwatch.poolers.base import Backend, PoolerError
from lagwatch.poolers.command import CommandPooler
from lagwatch.poolers.toml_file import TomlFilePooler

CHILD = r'''
import json, signal, sys, time, tomllib
from pathlib import Path

mode, config, log, ready = sys.argv[1:5]


def seen():
    text = Path(config).read_text()
    if mode == "text":
        return text
    data = tomllib.loads(text)
    if mode == "pgcat":
        return [s[0] for s in data["pools"]["app"]["shards"]["0"]["servers"] if s[2] == "replica"]
    return [d["host"] for d in data["databases"] if d["name"] == "app" and d.get("role") == "replica"]


def on_hup(signum, frame):
    with open(log, "a") as f:
        f.write(json.dumps(seen()) + "\n")


signal.signal(signal.SIGHUP, on_hup)
Path(ready).write_text("ready")
while True:
    time.sleep(0.05)
'''

BACKENDS = {
    "primary": Backend("primary", "10.0.0.1", 5432),
    "replica1": Backend("replica1", "10.0.0.2", 5432),
    "replica2": Backend("replica2", "10.0.0.3", None),
}

PGCAT = """\
[general]
port = 6432 # [pgcat]

[pools.app]
default_role = "replica"

[pools.app.shards.0]
servers = [
    [ "10.0.0.1", 5432, "primary" ], # the primary [writes]
    [ "10.0.0.2", 5432, "replica" ],
]
database = "app, main"
"""

PGDOG = """\
[general]
port = 6432

[[databases]]
name = "app"
host = "10.0.0.1"

[[databases]]
name = "app"
host = "10.0.0.2"
port = 5432
role = "replica"
database_name = "app_main"
"""


class Reloader:
    """The child process standing in for the pooler."""

    def __init__(self, tmp_path: Path, mode: str, config: Path) -> None:
        script = tmp_path / "fake_pooler.py"
        script.write_text(CHILD)
        self.log = tmp_path / f"{mode}-reloads.log"
        ready = tmp_path / f"{mode}-ready"
        self.proc = subprocess.Popen([sys.executable, str(script), mode, str(config), str(self.log), str(ready)])
        self.pid = self.proc.pid
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert self.proc.poll() is None, "fake pooler exited"
            assert time.monotonic() < deadline, "fake pooler did not start"
            time.sleep(0.02)

    @property
    def reload_command(self) -> tuple[str, ...]:
        return ("kill", "-HUP", str(self.pid))

    def seen(self) -> list[object]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def wait_reloads(self, count: int) -> list[object]:
        deadline = time.monotonic() + 10
        while len(self.seen()) < count:
            assert time.monotonic() < deadline, f"fake pooler saw {len(self.seen())} reloads, wanted {count}"
            time.sleep(0.02)
        return self.seen()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(5)


@pytest.fixture(params=["pgcat", "pgdog"])
def toml_setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path, Reloader]]:
    kind: str = request.param
    config = tmp_path / f"{kind}.toml"
    config.write_text(PGCAT if kind == "pgcat" else PGDOG)
    reloader = Reloader(tmp_path, kind, config)
    try:
        yield kind, config, reloader
    finally:
        reloader.stop()


def toml_pooler(kind: str, config: Path, command: tuple[str, ...], timeout: float = 10.0) -> TomlFilePooler:
    cfg = TomlPoolerConfig(kind=kind, config_file=config, pool="app", reload_command=command)
    return {"pgcat": pgcat, "pgdog": pgdog}[kind].pooler(cfg, BACKENDS, timeout)


def stat_key(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def test_toml_apply_rewrites_and_the_pooler_reloads(toml_setup: tuple[str, Path, Reloader]) -> None:
    kind, config, reloader = toml_setup
    pooler = toml_pooler(kind, config, reloader.reload_command)
    assert pooler.kind == kind
    assert pooler.read_pool() == {"replica1"}

    pooler.apply_pool(frozenset({"replica1", "replica2"}))
    assert reloader.wait_reloads(1)[-1] == ["10.0.0.2", "10.0.0.3"]
    assert pooler.read_pool() == {"replica1", "replica2"}

    pooler.apply_pool(frozenset({"replica2"}))
    assert reloader.wait_reloads(2)[-1] == ["10.0.0.3"]
    assert pooler.read_pool() == {"replica2"}

    pooler.apply_pool(frozenset({"primary"}))  # fallback: the primary serves reads
    assert reloader.wait_reloads(3)[-1] == ["10.0.0.1"]
    assert pooler.read_pool() == {"primary"}

    pooler.apply_pool(frozenset({"replica1"}))
    assert reloader.wait_reloads(4)[-1] == ["10.0.0.2"]
    original = PGCAT if kind == "pgcat" else PGDOG
    assert config.read_text() == original  # back to the same set: back to the same bytes
    assert [p.name for p in config.parent.iterdir() if p.name.startswith(".")] == []  # no temp files left


# Files as operators write them: comments, inline tables, arrays of tables, non-ASCII text.
RICH = {
    "pgcat": """\
# PgCat — «app» cluster, Zürich
[general]
host = "0.0.0.0"
port = 6432 # [pgcat]
tls = { certificate = "/etc/pgcat/cert.pem", private_key = "/etc/pgcat/key.pem" }

[[plugins.prewarmer.queries]]
query = "SELECT 'naïve'"

[[plugins.prewarmer.queries]]
query = "SELECT 2"  # 二

[pools.app]
default_role = "replica"  # reads → replicas

[pools.app.users.0]
username = "app"
password = "pässwörd"

[pools.app.shards.0]
# [ host, port, role ]
servers = [
    [ "10.0.0.1", 5432, "primary" ], # the primary [writes]
    [ "10.0.0.3", 5432, "replica" ], # zone b — Genève
    [ "10.0.0.2", 5432, "replica" ], # zone a
]
database = "app, main"
""",
    "pgdog": """\
# PgDog — «app» cluster, Zürich
[general]
port = 6432
tls = { cert = "/etc/pgdog/cert.pem" }

[[databases]]
name = "app"
host = "10.0.0.1"
database_name = "app_main"  # the primary

# zone b — Genève
[[databases]]
name = "app"
host = "10.0.0.3"
role = "replica"
database_name = "app_main"

# zone a
[[databases]]
name = "app"
host = "10.0.0.2"
port = 5432
role = "replica"
database_name = "app_main"

# —— other databases ——

[[databases]]
name = "métriques"
host = "10.5.0.1"

[[users]]
name = "app"
password = "pässwörd"
""",
}


def changed_lines(old: Path, new: Path) -> list[str]:
    """The lines ``diff -u`` shows as removed or added."""
    out = subprocess.run(["diff", "-u", str(old), str(new)], capture_output=True, text=True, check=False)
    assert out.returncode in (0, 1), out.stderr
    print(out.stdout)
    return [line for line in out.stdout.splitlines()[2:] if line[:1] in "+-"]


@pytest.mark.parametrize("kind", ["pgcat", "pgdog"])
def test_eject_and_readmit_changes_only_the_replica_list(tmp_path: Path, kind: str) -> None:
    original = tmp_path / "original.toml"
    original.write_text(RICH[kind])
    config = tmp_path / f"{kind}.toml"
    config.write_text(RICH[kind])
    ejected = tmp_path / "ejected.toml"
    reloader = Reloader(tmp_path, kind, config)
    try:
        pooler = toml_pooler(kind, config, reloader.reload_command)
        assert pooler.read_pool() == {"replica1", "replica2"}
        pooler.apply_pool(frozenset({"replica1"}))
        assert reloader.wait_reloads(1)[-1] == ["10.0.0.2"]
        ejected.write_text(config.read_text())
        pooler.apply_pool(frozenset({"replica1", "replica2"}))
        assert sorted(reloader.wait_reloads(2)[-1]) == ["10.0.0.2", "10.0.0.3"]
    finally:
        reloader.stop()
    if kind == "pgcat":
        # one line out, one line in, both replica entries of pool app
        assert changed_lines(original, ejected) == ['-    [ "10.0.0.3", 5432, "replica" ], # zone b — Genève']
        assert changed_lines(ejected, config) == ['+    [ "10.0.0.3", 5432, "replica" ],']
    else:
        # replica2's table leaves with its comment; it comes back after the pool's last
        # table, copied from replica1's (comments are not copied)
        assert changed_lines(original, ejected) == [
            "-# zone b — Genève", "-[[databases]]", '-name = "app"', '-host = "10.0.0.3"', '-role = "replica"',
            '-database_name = "app_main"', "-"]
        assert changed_lines(ejected, config) == [
            "+[[databases]]", '+name = "app"', '+host = "10.0.0.3"', "+port = 5432", '+role = "replica"',
            '+database_name = "app_main"', "+"]


def test_toml_unchanged_pool_means_no_write_and_no_reload(toml_setup: tuple[str, Path, Reloader],
                                                          tmp_path: Path) -> None:
    kind, config, reloader = toml_setup
    before = stat_key(config)
    # The reload command notes that it ran before it signals the pooler: had it run, the
    # note would be there when apply_pool returns (no waiting for a signal to land).
    ran = tmp_path / "reload-ran"
    noting = ("sh", "-c", 'echo ran >> "$0" && exec "$@"', str(ran), *reloader.reload_command)
    toml_pooler(kind, config, noting).apply_pool(frozenset({"replica1"}))
    # a reload command that would fail proves none runs
    toml_pooler(kind, config, ("false",)).apply_pool(frozenset({"replica1"}))
    assert not ran.exists()
    assert stat_key(config) == before
    assert reloader.seen() == []


# A reload command that never ends by itself (a pooler that hangs on reload): a shell
# waiting on a child in its process group; {token} makes the child's command line unique.
HANGING = ("sh", "-c", "sleep {token} & wait")


@pytest.mark.parametrize(("command", "timeout", "message"), [
    (("false",), 10.0, "exited with status 1"),
    (("sh", "-c", "echo 'config error: bad servers' >&2; exit 3"), 10.0, "status 3: config error: bad servers"),
    (HANGING, 0.5, "timed out after 0.5s"),
    (("/nonexistent/reload-pooler",), 10.0, "could not be started"),
])
def test_toml_failed_reload_restores_the_previous_file(toml_setup: tuple[str, Path, Reloader],
                                                       command: tuple[str, ...], timeout: float, message: str) -> None:
    kind, config, reloader = toml_setup
    original = config.read_bytes()
    token = f"100000.{random.randrange(10**9)}"
    pooler = toml_pooler(kind, config, tuple(arg.replace("{token}", token) for arg in command), timeout=timeout)
    with pytest.raises(PoolerError, match=message) as caught:
        apply_or_give_up(pooler, frozenset({"replica1", "replica2"}))
    assert "restored" in str(caught.value)
    assert config.read_bytes() == original
    assert pooler.read_pool() == {"replica1"}
    assert reloader.seen() == []
    # apply_pool came back from a command that never ends (so it did not wait it out), and
    # the command's whole process group went with it: no child left behind.
    deadline = time.monotonic() + 10  # a SIGKILL lands when its process is next scheduled
    while left := running_with(token):
        assert time.monotonic() < deadline, f"the reload command's child {left} outlived its timeout"
        time.sleep(0.01)


def running_with(token: str) -> list[int]:
    """Live (not zombie) processes with ``token`` in their command line."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline and proc_state(int(entry.name)) not in (None, "Z", "X"):
                found.append(int(entry.name))
    return found


def apply_or_give_up(pooler: TomlFilePooler, members: frozenset[str], limit: float = 60) -> None:
    """``pooler.apply_pool(members)``, given up on (a failure) if it has not returned in
    ``limit`` seconds: a pooler that waits out a reload command that never ends would
    hang the suite. The limit is no measure of anything, only a way not to wait forever."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            pooler.apply_pool(members)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(limit)
    assert outcome, f"apply_pool still waiting on its reload command after {limit:g}s"
    if outcome[0] is not None:
        raise outcome[0]


def test_toml_read_pool_names_unknown_entries(toml_setup: tuple[str, Path, Reloader]) -> None:
    kind, config, reloader = toml_setup
    config.write_text(config.read_text().replace("10.0.0.2", "10.9.9.9"))
    pooler = toml_pooler(kind, config, reloader.reload_command)
    with pytest.raises(PoolerError, match=r"10\.9\.9\.9:5432"):
        pooler.read_pool()
    pooler.apply_pool(frozenset({"replica1"}))  # the daemon converges by applying
    assert reloader.wait_reloads(1)[-1] == ["10.0.0.2"]
    assert pooler.read_pool() == {"replica1"}


def test_toml_missing_file_and_unknown_member(tmp_path: Path) -> None:
    pooler = toml_pooler("pgcat", tmp_path / "absent.toml", ("true",))
    with pytest.raises(PoolerError, match="does not exist"):
        pooler.read_pool()
    config = tmp_path / "pgcat.toml"
    config.write_text(PGCAT)
    with pytest.raises(PoolerError, match="replica9"):
        toml_pooler("pgcat", config, ("true",)).apply_pool(frozenset({"replica9"}))
    assert config.read_text() == PGCAT


TEMPLATE = """\
# written by lagwatch: {members}
read_hosts = {hosts}
{backends}
"""


@pytest.fixture
def command_setup(tmp_path: Path) -> Iterator[tuple[Path, Reloader]]:
    output = tmp_path / "read-pool.conf"
    reloader = Reloader(tmp_path, "text", output)
    try:
        yield output, reloader
    finally:
        reloader.stop()


def command_pooler(output: Path, command: tuple[str, ...], timeout: float = 10.0) -> CommandPooler:
    cfg = CommandPoolerConfig(kind="command", template=TEMPLATE, output_file=output, reload_command=command)
    return CommandPooler(cfg, BACKENDS, timeout=timeout)


def test_command_apply_reload_and_read_back(command_setup: tuple[Path, Reloader]) -> None:
    output, reloader = command_setup
    pooler = command_pooler(output, reloader.reload_command)
    assert pooler.kind == "command"
    with pytest.raises(PoolerError, match="never applied"):
        pooler.read_pool()

    pooler.apply_pool(frozenset({"replica2", "replica1"}))
    # The template's final newline is kept (the config does not strip templates).
    expected = ("# written by lagwatch: replica1 replica2\nread_hosts = 10.0.0.2,10.0.0.3\n"
                "replica1 10.0.0.2:5432\nreplica2 10.0.0.3:5432\n")
    assert output.read_text() == expected
    assert reloader.wait_reloads(1)[-1] == expected
    assert pooler.read_pool() == {"replica1", "replica2"}
    assert json.loads(pooler.sidecar.read_text())["members"] == ["replica1", "replica2"]

    pooler.apply_pool(frozenset({"primary"}))
    expected = "# written by lagwatch: primary\nread_hosts = 10.0.0.1\nprimary 10.0.0.1:5432\n"
    assert reloader.wait_reloads(2)[-1] == expected
    assert pooler.read_pool() == {"primary"}


def test_command_unchanged_means_no_write_and_no_reload(command_setup: tuple[Path, Reloader]) -> None:
    output, reloader = command_setup
    command_pooler(output, reloader.reload_command).apply_pool(frozenset({"replica1"}))
    reloader.wait_reloads(1)
    before = stat_key(output), stat_key(output.with_name(output.name + ".members"))
    command_pooler(output, ("false",)).apply_pool(frozenset({"replica1"}))  # would fail, had it run
    assert (stat_key(output), stat_key(output.with_name(output.name + ".members"))) == before
    assert len(reloader.seen()) == 1


def test_command_failed_reload_restores_output_and_sidecar(command_setup: tuple[Path, Reloader]) -> None:
    output, reloader = command_setup
    command_pooler(output, reloader.reload_command).apply_pool(frozenset({"replica1"}))
    reloader.wait_reloads(1)
    sidecar = output.with_name(output.name + ".members")
    before = output.read_bytes(), sidecar.read_bytes()
    failing = command_pooler(output, ("sh", "-c", "echo 'reload refused' >&2; exit 2"))
    with pytest.raises(PoolerError, match="status 2: reload refused"):
        failing.apply_pool(frozenset({"replica1", "replica2"}))
    assert (output.read_bytes(), sidecar.read_bytes()) == before
    assert failing.read_pool() == {"replica1"}
    assert len(reloader.seen()) == 1


def test_command_first_apply_failing_removes_the_new_file(tmp_path: Path) -> None:
    output = tmp_path / "read-pool.conf"
    with pytest.raises(PoolerError, match="restored"):
        command_pooler(output, ("false",)).apply_pool(frozenset({"replica1"}))
    assert not output.exists()


def test_command_output_edited_by_hand_is_unknown_then_converges(command_setup: tuple[Path, Reloader]) -> None:
    output, reloader = command_setup
    pooler = command_pooler(output, reloader.reload_command)
    pooler.apply_pool(frozenset({"replica1"}))
    reloader.wait_reloads(1)
    output.write_text("read_hosts = 10.9.9.9\n")
    with pytest.raises(PoolerError, match="changed since lagwatch wrote it"):
        pooler.read_pool()
    pooler.apply_pool(frozenset({"replica1"}))
    assert reloader.wait_reloads(2)[-1] == output.read_text()
    assert pooler.read_pool() == {"replica1"}
