"""Log formats: human text (no second timestamp under journald) and JSON lines."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lagwatch.cli import setup_logging


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield None
    root.handlers[:] = handlers
    root.setLevel(level)


def _emit(capsys: pytest.CaptureFixture[str]) -> str:
    logging.getLogger("lagwatch.test").info("hello %s", "there")
    return capsys.readouterr().err.strip()


def test_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("info", "json")
    entry = json.loads(_emit(capsys))
    assert entry["msg"] == "hello there" and entry["level"] == "info" and entry["logger"] == "lagwatch.test"


def test_text_has_timestamp_except_under_journald(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    setup_logging("info", "text")
    line = _emit(capsys)
    assert line.endswith("INFO lagwatch.test: hello there") and line[:4].isdigit()
    monkeypatch.setenv("JOURNAL_STREAM", "8:1234")
    setup_logging("info", "text")
    assert _emit(capsys) == "INFO lagwatch.test: hello there"


@pytest.mark.parametrize("argv", [
    ["run", "-c", "F", "--log-format", "json", "--log-level", "debug"],
    ["--log-format", "json", "--log-level", "debug", "run", "-c", "F"],
    ["--log-format", "text", "run", "--log-format", "json", "-c", "F", "--log-level", "debug"],
])
def test_log_options_on_either_side_of_the_subcommand(argv: list[str]) -> None:
    from lagwatch.cli import build_parser

    args = build_parser().parse_args(argv)
    assert (args.log_format, args.log_level) == ("json", "debug")


def test_log_options_default_and_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    from lagwatch.cli import build_parser

    args = build_parser().parse_args(["validate", "-c", "F"])
    assert (args.log_format, args.log_level) == ("text", "info")
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["validate", "-c", "F", "--log-format", "xml"])
    assert exited.value.code == 2 and "--log-format" in capsys.readouterr().err


def test_run_with_log_format_after_the_subcommand(tmp_path: Path) -> None:
    """The real CLI: `lagwatch run -c F --log-format json` runs (it used to exit 2) and
    every line it logs is JSON, debug lines included."""
    with socket.socket() as s:  # two free ports: one for listen, one where nothing answers
        s.bind(("127.0.0.1", 0))
        with socket.socket() as t:
            t.bind(("127.0.0.1", 0))
            listen, dead = s.getsockname()[1], t.getsockname()[1]
    config = tmp_path / "lagwatch.yaml"
    config.write_text(f"listen: 127.0.0.1:{listen}\nclusters:\n  - name: main\n    primary:\n"
                      f"      dsn: host=127.0.0.1 port={dead} user=postgres dbname=postgres connect_timeout=1\n")
    daemon_dir = Path(__file__).resolve().parents[2] / "daemon"
    proc = subprocess.Popen([sys.executable, "-m", "lagwatch.cli", "run", "-c", str(config),
                             "--log-format", "json", "--log-level", "debug"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(daemon_dir)})
    try:
        assert proc.stderr is not None
        entries = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(e["msg"].startswith("main/primary down") for e in entries):
            line = proc.stderr.readline()
            if not line:
                break
            entries.append(json.loads(line))
        assert any(e["level"] == "debug" and e["msg"].startswith("main/primary down") for e in entries), entries
        assert any("listening on http://127.0.0.1" in e["msg"] for e in entries), entries
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_log_event_is_one_line_in_either_format(capsys: pytest.CaptureFixture[str], log_format: str) -> None:
    setup_logging("info", log_format)
    log = logging.getLogger("lagwatch.test")
    log.info("members from %s: %s", "https://p:8008", "a, b\n2026-01-01 ERROR forged, c\x1b[2K")
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        log.exception("unexpected")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert "\x1b" not in "".join(lines)
    message = lines[0] if log_format == "text" else json.loads(lines[0])["msg"]
    assert message.endswith("members from https://p:8008: a, b\\n2026-01-01 ERROR forged, c\\x1b[2K")
    if log_format == "text":
        assert "Traceback" in lines[1] and "boom\\nsecond line" in lines[1]
