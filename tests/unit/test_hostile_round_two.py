"""Hostile input, round two, in pure logic and the one-shot CLI: the escaping rule for
text lagwatch does not own (its log formats: test_logging.py), credentials in a Patroni
URL, symbolic links in clusters_dir, keys read from a file in error messages, and Patroni
answers bounded in size. (A running
daemon meets the same doors in tests/integration/test_hostile_doors.py.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from lagwatch.cli import main
from lagwatch.errors import key_path, validation_problems
from lagwatch.escape import escape_controls, excerpt, shown_url
from lagwatch.sources.clusterdir import ClusterDir
from lagwatch.sources.patroni import DiscoveryError, parse_cluster

SHADOW = "root:$6$SecretSalt$secrethash:19000:0:99999:7:::\nlagwatch:!secret:19000:0:99999:7:::\n"


@pytest.mark.parametrize(("text", "escaped"), [
    ("plain name", "plain name"),
    ("b\nERROR forged", "b\\nERROR forged"),
    ("c\x1b[31mred\r", "c\\x1b[31mred\\r"),
    ("line\u2028separator\u00a0nbsp", "line\\u2028separator\\xa0nbsp"),
    ("tab\there", "tab\\there"),
])
def test_one_rule_escapes_what_does_not_print(text: str, escaped: str) -> None:
    assert escape_controls(text) == escaped


def test_an_excerpt_is_bounded_and_escaped() -> None:
    assert excerpt("x" * 100, 10) == "x" * 10 + "…"
    assert excerpt("a\nb", 10) == "a\\nb"


@pytest.mark.parametrize(("url", "shown"), [
    ("https://lagwatch:UrlSecret-41@127.0.0.1:47360", "https://***@127.0.0.1:47360"),
    ("https://u:p@ss/w?rd#x@h:1", "https://***@h:1"),  # what a URL parser would take for a path
    # Round three: the user part, path, query and fragment may each be a token; none shows.
    ("https://TOKEN-only@h:1", "https://***@h:1"),
    ("https://[u:secret]@h:1", "https://***@h:1"),
    ("https://h:1/api/TOKEN/", "https://h:1/…"),
    ("https://h:1?token=TOKEN", "https://h:1/…"),
    ("https://h:1#TOKEN", "https://h:1/…"),
    ("https://h:1", "https://h:1"),
])
def test_a_urls_password_is_hidden(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def test_validate_refuses_a_patroni_url_with_a_password_without_repeating_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "lagwatch.yaml"
    path.write_text(yaml.safe_dump({"listen": "127.0.0.1:9", "clusters": [
        {"name": "main", "discovery": {"kind": "patroni", "urls": ["https://lagwatch:UrlSecret-41@127.0.0.1:47360"]},
         "members": {"dsn": "user=lagwatch"}}]}))
    assert main(["validate", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "UrlSecret-41" not in err
    assert "clusters[0].discovery.urls: 'https://***@127.0.0.1:47360'" in err
    assert "credentials go in username and password_file" in err


def test_a_key_read_from_a_file_is_shown_as_a_bounded_excerpt() -> None:
    key = "root:$6$SecretSalt$secrethash:19000:0:99999:7:::" + "x" * 200
    shown = key_path(("clusters", 0, key))
    assert shown == f"clusters[0].{key[:40]}…" and len(shown) < 60


def _cluster_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "clusters.d"
    folder.mkdir()
    (folder / "good.yaml").write_text("primary: {dsn: host=p}\nreplicas: [{name: r1, dsn: host=r1}]\n")
    return folder


def test_a_link_out_of_clusters_dir_is_refused_by_its_name_and_its_target_never_shown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    folder = _cluster_dir(tmp_path)
    shadow = tmp_path / "shadow"
    shadow.write_text(SHADOW)
    (folder / "shadow.yaml").symlink_to(shadow)
    (folder / "gone.yaml").symlink_to(tmp_path / "nothing-here")
    (folder / "inside.yaml").symlink_to(folder / "good.yaml")  # a ConfigMap's ..data/ link: followed
    d = ClusterDir(folder)
    with caplog.at_level(logging.INFO, "lagwatch.sources.clusterdir"):
        d.scan()
        d.scan()  # said once, not every scan
    standing = {Path(f.path).name: f.error for f in d.files}
    assert standing["shadow.yaml"] == ("a symbolic link to a file outside clusters_dir: not read (only files "
                                       "inside the directory are)")
    assert standing["gone.yaml"] == "a symbolic link to nothing: skipped"
    assert standing["inside.yaml"] is None and standing["good.yaml"] is None
    assert sorted(c.name for c in d.clusters) == ["good", "inside"]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2 and all("secret" not in e and str(shadow) not in e for e in errors), errors

    config = tmp_path / "lagwatch.yaml"
    config.write_text(yaml.safe_dump({"listen": "127.0.0.1:9", "clusters_dir": str(folder), "clusters": []}))
    assert main(["validate", "-c", str(config)]) == 2
    err = capsys.readouterr().err
    assert "shadow.yaml: a symbolic link to a file outside clusters_dir" in err
    assert "secret" not in err and "SecretSalt" not in err and "19000" not in err


def test_a_file_name_with_a_newline_is_one_escaped_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _cluster_dir(tmp_path)
    (folder / "bad\nERROR forged.yaml").write_text("primary: {dsn: host=p}\nnot_a_key: 1\n")
    config = tmp_path / "lagwatch.yaml"
    config.write_text(yaml.safe_dump({"listen": "127.0.0.1:9", "clusters_dir": str(folder), "clusters": []}))
    assert main(["validate", "-c", str(config)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert not any(line.startswith("ERROR forged") for line in err), err
    assert any("bad\\nERROR forged.yaml: not_a_key: unknown key" in line for line in err), err


def test_a_patroni_answer_with_more_members_than_allowed_is_refused_before_any_is_read() -> None:
    many = [{"name": f"m{i}", "host": "h", "port": 1} for i in range(4000)]
    with pytest.raises(DiscoveryError, match=r"^u: 4000 members, more than max_members \(32\): refused$"):
        parse_cluster({"members": many}, "u")
    assert len(parse_cluster({"members": many[:40]}, "u", max_members=40).members) == 40
    with pytest.raises(DiscoveryError, match="no usable name"):
        parse_cluster({"members": [{"name": "n" * 129, "host": "h", "port": 1}]}, "u")


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_state_dir_that_is_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    (tmp_path / "holds").write_text("not a directory")
    state_dir = tmp_path / "holds" if where == "a file" else tmp_path / "holds" / "deeper"
    config = tmp_path / "lagwatch.yaml"
    config.write_text(yaml.safe_dump({"listen": "127.0.0.1:9", "state_dir": str(state_dir), "clusters": [
        {"name": "main", "primary": {"dsn": "host=127.0.0.1 port=1"}}]}))
    assert main(["validate", "-c", str(config)]) == 2
    assert f"state_dir: '{tmp_path / 'holds'}' is not a directory" in capsys.readouterr().err
    # One that does not exist yet is fine: lagwatch makes it.
    config.write_text(yaml.safe_dump({"listen": "127.0.0.1:9", "state_dir": str(tmp_path / "new" / "state"),
                                      "clusters": [{"name": "main", "primary": {"dsn": "host=127.0.0.1 port=1"}}]}))
    assert main(["validate", "-c", str(config)]) == 0


def test_every_privilege_past_monitoring_is_flagged_with_its_severity() -> None:
    from lagwatch.grants import CRITICAL, WARNING, excess_privileges

    plain = {"superuser": False, "replication": False, "createrole": False, "createdb": False, "bypassrls": False,
             "memberships": [], "owned": 0}
    assert excess_privileges(plain) == []
    flagged = excess_privileges({**plain, "replication": True, "createrole": True, "owned": 2,
                                 "memberships": ["pg_execute_server_program", "pg_signal_backend"]})
    assert [(state, text.split(":")[0]) for state, text in flagged] == [
        (WARNING, "REPLICATION"), (WARNING, "CREATEROLE"), (CRITICAL, "pg_execute_server_program"),
        (WARNING, "pg_signal_backend"), (WARNING, "owns 2 object(s) in this database (tables, functions, schemas or "
                                                  "the database itself), itself or through a role it is a member of")]
    assert excess_privileges({**plain, "superuser": True, "replication": True})[0][0] == CRITICAL
    # Round three: through a role it may SET ROLE to, EXECUTE on functions that reach the
    # server's files, tables it may write, parameters it may set.
    (through,) = excess_privileges({**plain, "through_superuser": True, "replication": True})
    assert through[0] == CRITICAL and through[1].startswith("a member of a superuser role"), through
    more = excess_privileges({**plain, "functions": ["pg_read_binary_file(text)"], "writable": 3,
                              "parameters": ["log_min_messages", "shared_preload_libraries"]})
    assert [text for _, text in more] == [
        "EXECUTE on pg_read_binary_file(text): reads files on the server",
        "writes 3 table(s) in this database (INSERT, UPDATE, DELETE or TRUNCATE; lagwatch writes only its "
        "heartbeat table)",
        "ALTER SYSTEM or SET granted on parameter(s): log_min_messages, shared_preload_libraries"]


# -- the fuzz corpus's new doors -------------------------------------------------------------

@pytest.mark.timeout(240)
def test_fuzzed_patroni_answers_are_taken_or_refused_never_a_traceback(tmp_path: Path) -> None:
    """300 generated answers from a fixed seed, each served over HTTP to the fetch the
    daemon runs: a membership whose cluster config validates or is refused in words, or a
    DiscoveryError; every message printable, on one line."""
    import http.server
    import sys
    import threading

    from lagwatch.config import parse_config
    from lagwatch.sources.patroni import cluster_config, fetch_membership
    from pydantic import ValidationError

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hostile_configs import Generator

    generator = Generator(seed=20261126, folder=tmp_path / "fuzz")
    served: list[bytes] = [b""]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib names it so
            self.send_response(200)
            self.send_header("Content-Length", str(len(served[0])))
            self.end_headers()
            self.wfile.write(served[0])

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    config = parse_config({"clusters": [{"name": "main", "members": {"dsn": "user=lagwatch"}, "discovery": {
        "kind": "patroni", "urls": [f"http://127.0.0.1:{httpd.server_address[1]}"]}}]})
    cluster = config.patroni_clusters[0]
    failures, outcomes = [], {"taken": 0, "refused": 0}
    try:
        for i in range(300):
            served[0] = generator.patroni_answer()
            try:
                cluster_config(cluster, fetch_membership(cluster.discovery, 5.0))
                outcomes["taken"] += 1
            except (DiscoveryError, ValidationError) as exc:
                outcomes["refused"] += 1
                message = str(exc) if isinstance(exc, DiscoveryError) else "; ".join(validation_problems(exc))
                if not message.isprintable() or len(message) > 2000:
                    failures.append(f"case {i}: {message[:300]!r}")
            except BaseException as exc:  # the property is "nothing else escapes"
                failures.append(f"case {i}: {type(exc).__name__}: {exc}"[:300])
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert not failures, "\n".join(failures[:20])
    assert outcomes["taken"] >= 10 and outcomes["refused"] >= 100, outcomes


@pytest.mark.timeout(240)
def test_fuzzed_cluster_files_get_one_printable_line_each_never_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """40 directories of 5 generated cluster files each (names and contents), through
    `lagwatch validate`: exit 0 or 2, and every line it prints printable."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hostile_configs import Generator

    generator = Generator(seed=20261127, folder=tmp_path / "fuzz")
    failures, outcomes = [], {0: 0, 2: 0}
    for i in range(40):
        folder = tmp_path / f"dir-{i}"
        folder.mkdir()
        for _ in range(5):
            name, raw = generator.cluster_file()
            (folder / name).write_bytes(raw)
        config = tmp_path / f"config-{i}.yaml"
        config.write_text(yaml.safe_dump({"listen": "127.0.0.1:9", "clusters_dir": str(folder), "clusters": []}))
        try:
            code = main(["validate", "-c", str(config)])
        except BaseException as exc:  # the property is "no exception escapes"
            failures.append(f"dir {i}: {type(exc).__name__}: {exc}"[:300])
            continue
        err = capsys.readouterr().err
        outcomes[code] = outcomes.get(code, 0) + 1
        if code not in (0, 2) or "Traceback" in err or not all(line.isprintable() for line in err.splitlines()):
            failures.append(f"dir {i}: exit {code}: {err[:300]!r}")
    assert not failures, "\n".join(failures[:20])
    assert outcomes[2] >= 20, outcomes


def test_a_session_calling_itself_lagwatch_leader_is_lagwatch_only_as_lagwatchs_role() -> None:
    from lagwatch.estimate.snapshot import LockHolder

    assert LockHolder(1, "lagwatch-leader", "lagwatch", "", False, lagwatch_role=True).is_lagwatch
    assert not LockHolder(2, "lagwatch-leader", "mallory", "", False, lagwatch_role=False).is_lagwatch
    assert not LockHolder(3, "psql", "lagwatch", "", False, lagwatch_role=True).is_lagwatch
