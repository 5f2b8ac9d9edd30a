"""Hostile input, round three (issue 3/6): what a command prints. Every line lagwatch
prints, logs or writes goes through one escaping rule (escape.py), whatever put a control
character into it: a file name, a cluster's name, a server's message."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from lagwatch.cli import main


def _lines(text: str) -> list[str]:
    return text.splitlines()


def test_validate_prints_a_broken_cluster_files_problem_once_and_escaped(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """(Before, clusters_dir's own log line went out raw through Python's last-resort
    handler ahead of the command's escaped copy: a file name's newline forged a line.)"""
    folder = tmp_path / "clusters.d"
    folder.mkdir()
    (folder / "x\nERROR forged.yaml").write_text("primary: {dsn: host=p}\nbad_key: 1\n")
    config = tmp_path / "lagwatch.yaml"
    config.write_text(yaml.safe_dump({"listen": "127.0.0.1:9", "clusters_dir": str(folder), "clusters": []}))
    assert main(["validate", "-c", str(config)]) == 2
    err = capsys.readouterr().err
    assert not any(line.startswith("ERROR forged") for line in _lines(err)), err
    assert sum("bad_key: unknown key" in line for line in _lines(err)) == 1, err
    assert "x\\nERROR forged.yaml: bad_key: unknown key" in err


@pytest.fixture
def root_logging() -> Iterator[None]:
    """`lagwatch check` sets up the root logger for the process: put it back after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.usefixtures("root_logging")
def test_check_escapes_what_it_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cluster named with a newline and an escape sequence, its nodes unreachable: the
    check's summary and table put neither on a line of its own (before, a name forged
    "LAGWATCH OK - all fine" as a line of the plugin's output)."""
    config = tmp_path / "lagwatch.yaml"
    config.write_text(yaml.safe_dump({
        "listen": "127.0.0.1:9", "interval": "100ms", "connect_timeout": "100ms",
        "clusters": [{"name": "c\nLAGWATCH OK - all fine\x1b[2J", "primary": {"dsn": "host=127.0.0.1 port=1"},
                      "replicas": [{"name": "r1", "dsn": "host=127.0.0.1 port=1"}]}]}))
    code = main(["check", "-c", str(config)])
    out = capsys.readouterr().out
    assert code == 2, out
    assert not any(line.startswith("LAGWATCH OK") for line in _lines(out)), out
    assert "\x1b" not in out and "c\\nLAGWATCH OK - all fine\\x1b[2J" in out, out


@pytest.mark.parametrize("dsn", [
    "postgresql://lagwatch@myserver:AzSecret99@db.example.com:5432/postgres",  # Azure-style user@server
    "postgresql://lagwatch:AzSecret99@db@127.0.0.1/postgres",  # '@' in the password
    "postgresql://lagwatch:AzSecret99/x@127.0.0.1/postgres",  # '/' in the password
    "postgresql://lagwatch:Az:Secret99@127.0.0.1:5432/postgres",  # ':' in the password
])
def test_a_uri_whose_password_holds_a_delimiter_is_refused_without_its_tail(
        dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """libpq takes the tail of such a password for the port or the host: validate refuses
    the DSN without showing either, and says to percent-encode (before, "port
    'AzSecret99@db.example.com:5432' is not a TCP port number", or a host with '@' that
    passed validate and was then logged as "failed to resolve host 'AzSecret99@...'")."""
    config = tmp_path / "lagwatch.yaml"
    config.write_text(yaml.safe_dump({"listen": "127.0.0.1:9", "clusters": [
        {"name": "main", "primary": {"dsn": dsn}}]}))
    code = main(["validate", "-c", str(config)])
    err = capsys.readouterr().err
    assert "Secret99" not in err, err
    if code == 0:  # ':' in a URI's password is no delimiter there: libpq reads it whole
        assert dsn.startswith("postgresql://lagwatch:Az:")
    else:
        assert code == 2 and "percent-encode" in err, err


def test_member_churn_is_said_in_bounded_lines(monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """A Patroni that renames its 32 members in every answer (an attacker's, or a broken
    one): the membership-change lines are a burst of CHANGE_LINES_BURST, then one now and
    then saying how many changes went unsaid, each listing at most NAMES_SHOWN names (before,
    every answer logged every name: 1.37 MB of log in 40 s). Members that join and leave
    now and then, a failover's changes among them, are each said (test_patroni)."""
    import asyncio
    import logging

    from lagwatch.config import parse_config
    from lagwatch.sources import discovery as discovery_module
    from lagwatch.sources.discovery import CHANGE_LINES_BURST, CHANGE_LINES_EVERY, NAMES_SHOWN, Discovery
    from lagwatch.sources.patroni import Membership, parse_cluster

    answer = [0]

    def fetch(config: object, timeout: float) -> Membership:
        answer[0] += 1
        members = [{"name": f"m{answer[0]}-{i:02d}-{'x' * 40}", "host": "10.0.0.1", "port": 5432 + i}
                   for i in range(32)]
        return parse_cluster({"members": members}, "http://x:1")

    clock = [1000.0]
    monkeypatch.setattr(discovery_module, "fetch_membership", fetch)
    monkeypatch.setattr(discovery_module.time, "monotonic", lambda: clock[0])
    clusters = parse_config({"clusters": [{"name": "m", "discovery": {"kind": "patroni", "urls": ["http://x:1"]},
                                           "members": {"dsn": "user=x"}}]}).patroni_clusters
    discovery = Discovery()
    with caplog.at_level(logging.INFO, "lagwatch.sources.discovery"):
        for _ in range(120):  # an answer a second for two minutes
            assert asyncio.run(discovery.refresh(clusters, 1.0))
            clock[0] += 1.0
    lines = [r.getMessage() for r in caplog.records if "members from" in r.getMessage()]
    assert CHANGE_LINES_BURST <= len(lines) <= CHANGE_LINES_BURST + 120 // CHANGE_LINES_EVERY + 1, len(lines)
    assert all(line.count("-xxxx") <= 3 * NAMES_SHOWN for line in lines), lines[-1]
    assert "and 24 more" in lines[0]
    # Every name of every answer, as before: some 96 names of ~46 characters, 120 times.
    assert sum(len(line) for line in lines) < 0.15 * 96 * 46 * 120
    # Once the churn stops, an occasional change is said again, with what went unsaid.
    clock[0] += 10 * CHANGE_LINES_EVERY
    caplog.clear()
    with caplog.at_level(logging.INFO, "lagwatch.sources.discovery"):
        asyncio.run(discovery.refresh(clusters, 1.0))
    (line,) = [r.getMessage() for r in caplog.records if "members from" in r.getMessage()]
    assert "change(s) since the last such line not said one by one" in line, line


@pytest.mark.parametrize(("urls", "allowed", "host", "ok"), [
    (["http://10.0.0.1:8008"], None, "10.0.0.7", True),  # the URL's /24
    (["http://10.0.0.1:8008"], None, "10.0.1.7", False),
    (["http://10.0.0.1:8008"], None, "127.0.0.5", False),  # a fake server elsewhere
    (["http://[fd00::1]:8008"], None, "fd00::9", True),  # the URL's /64
    (["http://pg1.db.example.com:8008"], None, "pg2.db.example.com", True),  # the URL host's domain
    (["http://pg1.db.example.com:8008"], None, "evil.example.org", False),
    (["http://pg1.db.example.com:8008"], None, "10.0.0.7", False),  # an address where URLs name hosts
    (["http://patroni:8008"], None, "pg2", True),  # one label: the same search domain
    (["http://10.0.0.1:8008"], ["192.168.5.0/24", ".example.com"], "192.168.5.9", True),
    (["http://10.0.0.1:8008"], ["192.168.5.0/24", ".example.com"], "db.example.com", True),
    (["http://10.0.0.1:8008"], ["192.168.5.0/24", ".example.com"], "10.0.0.7", False),  # as configured only
])
def test_a_member_is_reached_only_where_discovery_allows(urls: list[str], allowed: list[str] | None, host: str,
                                                         ok: bool) -> None:
    """A member pointed at a host outside ``allowed_hosts`` (by default the URLs' network or
    domain) refuses the answer: its connection would carry the members' password (before,
    a fake server on 127.0.0.5 got it in clear 8 times in 5 s)."""
    from lagwatch.config import PatroniDiscoveryConfig
    from lagwatch.sources.patroni import DiscoveryError, member_hosts, parse_cluster

    config = PatroniDiscoveryConfig(kind="patroni", urls=tuple(urls),
                                    allowed_hosts=tuple(allowed) if allowed else None)
    answer = {"members": [{"name": "pg-b", "host": host, "port": 5432}]}
    if ok:
        assert [m.host for m in parse_cluster(answer, "u", hosts=member_hosts(config)).members] == [host]
    else:
        with pytest.raises(DiscoveryError, match=f"member pg-b is at {host}, outside allowed_hosts"):
            parse_cluster(answer, "u", hosts=member_hosts(config))


@pytest.mark.parametrize("value", ["password=FuzzS3cret", "postgresql://u:FuzzS3cret@h/db",
                                   "https://FuzzS3cret@h:1", "https://h:1/FuzzS3cret", "x https://h:1?t=FuzzS3cret y"])
def test_an_excerpt_hides_what_is_shaped_like_a_secret(value: str) -> None:
    from lagwatch.escape import excerpt

    assert "FuzzS3cret" not in excerpt(value, 200)


ONE_CLUSTER = [{"name": "main", "primary": {"dsn": "host=127.0.0.1 port=1"}}]
WEB_SECRETS = [  # where the seed-27 fuzz run of 2,000 cases found a secret echoed (6 cases)
    {"basic_auth_users": {"https://h:8008/FuzzS3cret/": "plain"}},
    {"basic_auth_users": {"password=FuzzS3cret": "plain"}},
    {"http_server_config": {"headers": {"host=h password='FuzzS3cret x'": "1"}}},
    {"http_server_config": {"headers": {"https://h:8008#FuzzS3cret": "1"}}},
]


@pytest.mark.parametrize("listen", ["https://h:8008/FuzzS3cret/", "postgresql://u:FuzzS3cret/x@h/db",
                                    "https://h:8008?token=FuzzS3cret", "https://h:8008#FuzzS3cret"])
def test_a_listen_value_that_is_a_url_is_refused_without_its_tail(
        listen: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(Before, the refusal quoted what followed the last ':', "port must be 1-65535, got
    '8008/FuzzS3cret/'": a token on its own does not look like a secret.)"""
    config = tmp_path / "lagwatch.yaml"
    config.write_text(yaml.safe_dump({"listen": listen, "clusters": ONE_CLUSTER}))
    assert main(["validate", "-c", str(config)]) == 2
    err = capsys.readouterr().err
    assert "FuzzS3cret" not in err and "listen: port must be 1-65535" in err, err


@pytest.mark.parametrize("web", WEB_SECRETS)
def test_a_web_config_key_is_refused_without_echoing_a_secret(
        web: dict[str, object], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A user name or a header name is shown as any unexpected value is: a password or a
    token pasted in a key's place is hidden, and the key is still named."""
    config = tmp_path / "lagwatch.yaml"
    config.write_text(yaml.safe_dump({"listen": "127.0.0.1:9", "clusters": ONE_CLUSTER}))
    web_file = tmp_path / "web.yaml"
    web_file.write_text(yaml.safe_dump(web))
    assert main(["validate", "-c", str(config), "--web.config.file", str(web_file)]) == 2
    err = capsys.readouterr().err
    assert "FuzzS3cret" not in err, err
    assert ("not a plain password" in err) if "basic_auth_users" in web else ("can not be configured" in err), err


class CleartextAsker:
    """A fake PostgreSQL server on a loopback address: it declines SSL and GSS, answers a
    startup message with AuthenticationCleartextPassword, and keeps what comes next (a
    client that obeys sends its password there, in clear)."""

    def __init__(self, host: str) -> None:
        import socket
        import threading

        self.sock = socket.create_server((host, 0))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import struct

        self.sock.settimeout(10)
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)
            try:
                while True:  # SSLRequest and GSSENCRequest: 'N', then the startup message
                    length, code = struct.unpack("!ii", conn.recv(8, 0x100))
                    if code in (80877103, 80877104):
                        conn.sendall(b"N")
                        continue
                    conn.recv(length - 8, 0x100)
                    break
                conn.sendall(b"R" + struct.pack("!ii", 8, 3))  # AuthenticationCleartextPassword
                self.received.append(conn.recv(4096))  # a password message, or b"" when refused
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()
        self._thread.join(5)


@pytest.mark.parametrize(("template", "sent"), [
    ("user=lagwatch dbname=postgres", False),  # the default: never in clear to a discovered member
    ("user=lagwatch dbname=postgres require_auth=password", True),  # the operator's own choice stands
])
def test_a_host_patroni_names_is_not_sent_the_password_in_clear(template: str, sent: bool, tmp_path: Path) -> None:
    """Patroni names a member on 127.0.0.5, inside allowed_hosts, where a fake server asks
    for the password in clear: libpq, with the DSN lagwatch builds for the member, refuses
    before sending it (before: the members' password went to it 8 times in 5 s)."""
    import psycopg
    from lagwatch.config import parse_config
    from lagwatch.read.conninfo import build_conninfo
    from lagwatch.sources.patroni import cluster_config, parse_cluster

    if psycopg.pq.version() < 160000:
        pytest.skip("require_auth needs libpq 16+")  # said in docs/roles-and-failover.md
    fake = CleartextAsker("127.0.0.5")
    try:
        secret = tmp_path / "members.pass"
        secret.write_text("MembersS3cret\n")
        secret.chmod(0o600)
        (patroni,) = parse_config({"clusters": [{
            "name": "main", "members": {"dsn": template, "password_file": str(secret)},
            "discovery": {"kind": "patroni", "urls": ["http://127.0.0.1:8008"], "allowed_hosts": ["127.0.0.0/8"]}}],
        }).patroni_clusters
        answer = {"members": [{"name": "pg-b", "role": "replica", "host": fake.host, "port": fake.port}]}
        (member,) = cluster_config(patroni, parse_cluster(answer, "u", hosts=None)).replicas
        with pytest.raises(psycopg.OperationalError) as refused:
            psycopg.connect(build_conninfo(member, 2.0, 2.0), connect_timeout=5).close()
    finally:
        fake.close()
    assert (b"MembersS3cret" in b"".join(fake.received)) is sent, (fake.received, str(refused.value))
    if not sent:
        assert "password" in str(refused.value), str(refused.value)
