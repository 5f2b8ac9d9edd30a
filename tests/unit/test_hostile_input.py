"""Hostile config and web config files: exit 0, or exit 2 with one line per problem; never
a traceback, never a hang. The repros first, then a seeded fuzz run (bench/fuzz.py runs
longer and prints the outcomes)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml
from lagwatch.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hostile_configs import Generator, check_output

BASE = {"interval": "1s", "listen": "127.0.0.1:9",
        "clusters": [{"name": "main", "primary": {"dsn": "host=127.0.0.1 port=1"},
                      "replicas": [{"name": "r1", "dsn": "host=127.0.0.2 port=1"}]}]}


def validate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["validate", *argv])
    return code, capsys.readouterr().err


@pytest.mark.timeout(20)
@pytest.mark.parametrize("target", ["fifo", "/dev/zero", "directory", "too big"])
def test_a_config_path_that_is_not_a_small_regular_file(tmp_path: Path, target: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    expected = {"fifo": "a FIFO, not a regular file", "/dev/zero": "a device, not a regular file",
                "directory": "a directory, not a regular file", "too big": "larger than 1024 KiB"}[target]
    if target == "fifo":
        os.mkfifo(path)  # opened for reading with no writer: would wait forever
    elif target == "/dev/zero":
        path = Path("/dev/zero")  # read to the end: MemoryError
    elif target == "directory":
        path.mkdir()
    else:
        path.write_text("# padding\n" * 200_000)
    for command in ("validate", "run", "check"):
        code = main([command, "-c", str(path)])
        err = capsys.readouterr().err
        assert code == 2 and expected in err and "Traceback" not in err, (command, err)
        assert check_output(code, err) is None, err
    web = tmp_path / "ok.yaml"
    web.write_text(yaml.safe_dump(BASE))
    code, err = validate(capsys, "-c", str(web), "--web.config.file", str(path))
    assert code == 2 and expected.replace("1024", "64") in err, err


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("not-utf8", b"interval: 1s\n# caf\xe9\n", "not UTF-8: byte 0xe9 at offset 18 (line 2, byte 6 of the line)"),
    ("nested", b"clusters: " + b"[" * 1000 + b"]" * 1000 + b"\n", "line 1: nested more than 64 levels deep"),
    ("huge-int", b"interval: " + b"9" * 5000 + b"\n", "Exceeds the limit (4300 digits)"),
    ("aliases", b"a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
        b"%c: &%c [%s]\n" % (98 + i, 98 + i, b", ".join([b"*%c" % (97 + i)] * 9)) for i in range(8)),
     "more than 200000 values once YAML aliases are expanded"),
    ("control", b'"evil\\x1b[2J\\nINFO fake log line": 1\n', "evil\\x1b[2J\\nINFO fake log line: unknown key"),
])
def test_hostile_text_gets_one_line_per_problem(tmp_path: Path, name: str, text: bytes, expected: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(text)
    code, err = validate(capsys, "-c", str(path))
    assert expected in err, err
    assert check_output(code, err) is None and code == 2, err


@pytest.mark.parametrize("setting", ["state_dir", "clusters_dir", "password_file"])
@pytest.mark.parametrize("why", ["name too long", "symlink loop"])
def test_a_path_the_system_cannot_look_up_is_a_problem_not_a_traceback(tmp_path: Path, setting: str, why: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Path.exists() and is_dir() raise on a name longer than the system allows or a loop of
    symlinks (found by the fuzz run below once its folder's name had another length)."""
    if why == "name too long":
        path, reason = "/" + "x" * 5000, "File name too long"
    else:
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
        path, reason = str(tmp_path / "loop"), "Too many levels of symbolic links"
    config: dict[str, object] = {**BASE, setting: path}
    if setting == "password_file":
        config = {**BASE, "clusters": [{**BASE["clusters"][0],  # type: ignore[index]
                                        "primary": {"dsn": "host=127.0.0.1 port=1", "password_file": path}}]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    code, err = validate(capsys, "-c", str(tmp_path / "config.yaml"))
    assert code == 2 and reason in err and "Traceback" not in err, err
    assert check_output(code, err) is None and len(err) < 1000, err


@pytest.mark.parametrize(("web", "expected"), [
    ("basic_auth_users: {p: '$2b$03$" + "a" * 53 + "'}", "p: bcrypt cost 03 is out of range (4 to 16"),
    ("basic_auth_users: {p: '$2b$99$" + "a" * 53 + "'}", "p: bcrypt cost 99 is out of range"),
    ("basic_auth_users: {p: '$2b$31$" + "a" * 53 + "'}", "p: bcrypt cost 31 is out of range"),
    ('http_server_config: {headers: {Content-Security-Policy: "default-src caf\u00e9"}}',
     "Content-Security-Policy: the value must be printable ASCII on one line"),
    ('http_server_config: {headers: {Strict-Transport-Security: "max-age=1\\u2028"}}',
     "the value must be printable ASCII"),
])
def test_web_config_values_that_would_kill_the_server_are_refused(tmp_path: Path, web: str, expected: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "web.yml").write_text(web + "\n")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**BASE, "web_config_file": str(tmp_path / "web.yml")}))
    code, err = validate(capsys, "-c", str(tmp_path / "config.yaml"))
    assert code == 2 and expected in err, err
    assert check_output(code, err) is None, err


@pytest.mark.timeout(240)
def test_fuzzed_configs_and_web_configs_never_traceback_or_hang(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """400 generated files from a fixed seed (bench/fuzz.py runs more seeds)."""
    generator = Generator(seed=20261123, folder=tmp_path / "fuzz")
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({**BASE, "state_dir": str(tmp_path / "state")}))
    failures, outcomes = [], {0: 0, 2: 0}
    for i in range(400):
        case = generator.case()
        path = tmp_path / f"case-{i}.yaml"
        path.write_bytes(case.data)
        argv = ["-c", str(good), "--web.config.file", str(path)] if case.kind == "web" else ["-c", str(path)]
        try:
            code, err = validate(capsys, *argv)
        except BaseException as exc:  # the property is "no exception escapes"
            failures.append(f"case {i} {case.kind} {case.mutations}: {type(exc).__name__}: {exc}"[:500])
            continue
        outcomes[code] = outcomes.get(code, 0) + 1
        wrong = check_output(code, err)
        if wrong is not None:
            failures.append(f"case {i} {case.kind} {case.mutations}: {wrong}")
    assert not failures, "\n".join(failures[:20])
    assert outcomes[2] >= 200 and outcomes[0] >= 5, outcomes  # the generator reaches both outcomes
