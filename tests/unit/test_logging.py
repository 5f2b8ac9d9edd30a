"""Log formats: human text (no second timestamp under journald) and JSON lines."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

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
