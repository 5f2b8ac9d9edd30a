"""A reload's protocol (reload.py): real config files, a real sd_notify socket, and what
putting the config in force does recorded (the daemon's part; with a real daemon and real
servers: tests/integration/test_config_corpus.py, test_discovery_edges.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest
from lagwatch.config import Config
from lagwatch.errors import ConfigError
from lagwatch.reload import ConfigReload
from lagwatch.serve.sdnotify import Notifier

GOOD = """\
interval: {interval}
clusters:
  - name: main
    primary: {{dsn: "host=127.0.0.1 port=55432 user=postgres dbname=postgres"}}
"""


def said(s: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(s.recv(4096).decode())
        except BlockingIOError:
            return out


class Target:
    """What putting a config in force did: the configs it was given; fails when told."""

    def __init__(self) -> None:
        self.put: list[Config] = []
        self.fail: Exception | None = None

    async def __call__(self, config: Config) -> None:
        if self.fail is not None:
            raise self.fail
        self.put.append(config)


def test_a_good_file_is_put_in_force_and_a_bad_one_changes_nothing(
        tmp_path: Path, sock: socket.socket, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "lagwatch.yaml"
    path.write_text(GOOD.format(interval="1s"))
    now = [1000.0]
    reload = ConfigReload(path, None, Notifier({"NOTIFY_SOCKET": sock.getsockname()}), clock=lambda: now[0])
    assert (reload.ok, reload.success_at) == (True, 1000.0)  # the config loaded at start counts
    target = Target()

    now[0] = 1005.0
    path.write_text(GOOD.format(interval="2s"))
    assert asyncio.run(reload(target))
    assert [c.interval for c in target.put] == [2.0] and (reload.ok, reload.success_at) == (True, 1005.0)
    reloading, ready = said(sock)
    assert reloading.startswith("RELOADING=1") and f"STATUS=reloaded {path}" in ready and "READY=1" in ready

    # Two problems in the file: both named, with where they are; nothing put in force.
    now[0] = 1010.0
    path.write_text(GOOD.format(interval="fast").replace("name: main", "name: ''"))
    with caplog.at_level(logging.ERROR, logger="lagwatch.reload"):
        assert not asyncio.run(reload(target))
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("reload rejected, keeping the running config: ") and "interval" in line
    assert "clusters[0].name" in line or "clusters.0.name" in line, line
    assert len(target.put) == 1 and (reload.ok, reload.success_at) == (False, 1005.0)
    assert "STATUS=reload rejected, running the previous config" in said(sock)[-1]


def test_a_config_that_cannot_be_put_in_force_is_rejected_whole(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "lagwatch.yaml"
    path.write_text(GOOD.format(interval="1s"))
    reload, target = ConfigReload(path, None, Notifier({})), Target()
    target.fail = ConfigError("main", ["pooler: its file is not writable"])
    with caplog.at_level(logging.ERROR, logger="lagwatch.reload"):
        assert not asyncio.run(reload(target))
    assert not reload.ok and "not writable" in caplog.records[-1].getMessage()
    target.fail = None  # the next good reload is put in force and says so
    assert asyncio.run(reload(target)) and reload.ok and len(target.put) == 1
    # Anything else comes after the config was put in force (closing what it replaced): not
    # a rejection, and it reaches the caller (the daemon counts it as a background error).
    target.fail = RuntimeError("closing the replaced pollers failed")
    with pytest.raises(RuntimeError):
        asyncio.run(reload(target))
    assert reload.ok


def test_the_daemon_rejects_a_config_it_cannot_build_and_puts_a_good_one_in_force(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """No server needed: Daemon.put_in_force through a real reload; a runtime that cannot be
    built (a rule the schema missed, made to happen here) leaves the running config."""
    from lagwatch import daemon as daemon_module
    from lagwatch.config import load_config
    from lagwatch.daemon import Daemon

    path = tmp_path / "lagwatch.yaml"
    path.write_text(GOOD.format(interval="1s") + f"state_dir: {tmp_path / 'state'}\n")

    async def run() -> None:
        d = Daemon(load_config(path), path)
        running = d.runtime
        path.write_text(GOOD.format(interval="2s") + f"state_dir: {tmp_path / 'state'}\n")
        real_build = daemon_module.runtime_module.build

        def broken(*args: object, **kwargs: object) -> object:
            raise RuntimeError("a rule the schema missed")

        monkeypatch.setattr(daemon_module.runtime_module, "build", broken)
        with caplog.at_level(logging.ERROR):
            assert not await d.reload()
        assert d.runtime is running and d.config.interval == 1.0 and not d.reloads.ok
        assert "RuntimeError: a rule the schema missed" in caplog.text
        monkeypatch.setattr(daemon_module.runtime_module, "build", real_build)
        assert await d.reload()
        assert d.runtime is not running and d.config.interval == 2.0 and d.reloads.ok
        await d.close()

    asyncio.run(run())


def test_without_a_config_file_there_is_nothing_to_reload(caplog: pytest.LogCaptureFixture) -> None:
    target = Target()
    with caplog.at_level(logging.WARNING, logger="lagwatch.reload"):
        assert not asyncio.run(ConfigReload(None, None, Notifier({}))(target))
    assert target.put == [] and "not started from a config file" in caplog.text
