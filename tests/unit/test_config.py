"""Config validation: every problem at once, with its path; nothing secret echoed."""

import textwrap
from pathlib import Path
from typing import Any

import pytest
from lagwatch.cli import main
from lagwatch.config import load_config, parse_config
from lagwatch.durations import format_duration, parse_duration
from lagwatch.errors import ConfigError
from pydantic import ValidationError

ISSUE_EXAMPLE = """\
interval: 1s          # poll interval; accepts 250ms, 1s, 1m
window: 5m            # window for the lag quantiles
listen: 127.0.0.1:9847
clusters:
  - name: main
    primary:
      dsn: "host=127.0.0.1 port=55432 user=postgres dbname=postgres"
    replicas:
      - name: replica1
        dsn: "host=127.0.0.2 port=55432 user=postgres dbname=postgres"
      - name: replica2
        dsn: "host=127.0.0.3 port=55432 user=postgres dbname=postgres"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "lagwatch.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def problems(data: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.problems


@pytest.mark.parametrize("text,seconds", [("250ms", 0.25), ("1s", 1.0), ("1m", 60.0), ("1.5h", 5400.0), (2, 2.0)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_issue_example_loads_as_written(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ISSUE_EXAMPLE))
    assert config.interval == 1.0 and config.window == 300.0
    assert config.listen_address == ("127.0.0.1", 9847)
    (cluster,) = config.clusters
    assert [r.name for r in cluster.replicas] == ["replica1", "replica2"]
    assert cluster.replicas[0].walsender_name == "replica1"
    with pytest.raises(ValidationError):
        config.interval = 2.0  # type: ignore[misc]  # frozen


def test_all_errors_reported_with_paths() -> None:
    found = problems({
        "interval": "-1s",
        "window": "soon",
        "bogus": 1,
        "clusters": [{
            "name": "main",
            "primary": {},
            "replicas": [{"name": "r1", "dsn": "host=a"}, {"name": "r2", "dsn": "host=b = = x"}],
        }],
    })
    text = "\n".join(found)
    assert "interval: must not be negative" in text
    assert "window: expected a duration" in text
    assert "bogus: unknown key" in text
    assert "clusters[0].primary.dsn: required key is missing" in text
    assert "clusters[0].replicas[1].dsn: not a valid libpq connection string" in text
    assert len(found) == 5


def test_missing_clusters_and_wrong_types() -> None:
    assert any(p.startswith("clusters: at least one cluster is needed (or a clusters_dir)")
               for p in problems({"interval": "1s"}))
    found = problems({"clusters": [{"name": "m", "primary": {"dsn": 5}, "replicas": "r1"}]})
    assert any(p.startswith("clusters[0].primary.dsn:") for p in found)
    assert any(p.startswith("clusters[0].replicas:") for p in found)


@pytest.mark.parametrize("dsn", ["host=a password=s3cr3t junk", "postgresql://u:s3cr3t@[::1/db",
                                 "postgresql://u:s3cr3t@h/db?port=x&junk"])
def test_bad_dsn_with_password_does_not_echo_it(dsn: str) -> None:
    found = problems({"clusters": [{"name": "m", "primary": {"dsn": dsn}}]})
    assert found and all("s3cr3t" not in p for p in found), found
    assert any(p.startswith("clusters[0].primary.dsn: not a valid libpq connection string") for p in found), found


@pytest.mark.parametrize("dsn", ["lagwatch:S3cret@db:5432/postgres", "host=a S3cret", "S3cret=x host=a",
                                 "host='S3cret", "postgresql://u:S3cret@h/db?S3cret=1"])
def test_a_dsn_that_does_not_parse_is_never_echoed(dsn: str) -> None:
    """A typo (no postgresql://, a stray word) may put a password where libpq does not
    expect one: only the field and the kind of error are said, never the text."""
    found = problems({"clusters": [{"name": "m", "primary": {"dsn": dsn}}]})
    assert found and all("S3cret" not in p for p in found), found
    assert any(p.startswith("clusters[0].primary.dsn: not a valid libpq connection string (") for p in found)


def test_duplicates_and_reserved_names() -> None:
    found = problems({"clusters": [
        {"name": "m", "primary": {"dsn": "host=a"}, "replicas": [{"name": "r", "dsn": "host=b"},
                                                               {"name": "r", "dsn": "host=c"}]},
        {"name": "n", "primary": {"dsn": "host=a"}, "replicas": [{"name": "primary", "dsn": "host=b"}]},
    ]})
    text = "\n".join(found)
    assert "clusters[0]: replica name or application_name 'r' is used twice" in text
    assert "clusters[1].replicas[0].name: 'primary' is reserved" in text
    # Checks across clusters run once every cluster is valid on its own.
    found = problems({"clusters": [{"name": "m", "primary": {"dsn": "host=a"}},
                                   {"name": "m", "primary": {"dsn": "host=b"}}]})
    assert found == ["(top level): cluster names must be unique, repeated: m"]


def test_password_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    monkeypatch.setenv("LW_PW", "from-env")
    config = parse_config({"clusters": [{"name": "m", "primary": {"dsn": "host=a", "password_file": str(secret)},
                                         "replicas": [{"name": "r", "dsn": "host=b", "password_env": "LW_PW"}]}]})
    assert config.clusters[0].primary.password() == "from-file"
    assert config.clusters[0].replicas[0].password() == "from-env"
    found = problems({"clusters": [{"name": "m", "primary": {"dsn": "host=a",
                                                             "password_file": str(tmp_path / "missing")}}]})
    assert any("clusters[0].primary" in p and "not a readable file" in p for p in found)


@pytest.mark.parametrize("body,needle", [
    ("clusters: []\n", "clusters:"),
    ("interval: 1s\n", "clusters: at least one cluster is needed (or a clusters_dir)"),
    ("interval: [1\n", "not valid YAML"),
    ("- a\n- b\n", "expected a mapping"),
    (ISSUE_EXAMPLE.replace("interval: 1s ", "interval: -5s"), "interval: must not be negative"),
    (ISSUE_EXAMPLE.replace("listen: 127.0.0.1:9847", "listen: nowhere"), "listen: "),
    (ISSUE_EXAMPLE.replace('dsn: "host=127.0.0.3', 'dsn: "hots=127.0.0.3'), "clusters[0].replicas[1].dsn: "),
    (ISSUE_EXAMPLE.replace("window: 5m ", "window: true"), "window: "),
    (ISSUE_EXAMPLE + "extra_key: 1\n", "extra_key: unknown key"),
])
def test_cli_validate_exits_2_with_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               body: str, needle: str) -> None:
    path = write(tmp_path, body)
    assert main(["validate", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and needle in err


def test_cli_validate_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "-c", str(write(tmp_path, ISSUE_EXAMPLE))]) == 0
    assert "ok" in capsys.readouterr().out


def test_cli_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "-c", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read file" in capsys.readouterr().err


def test_shipped_example_config_validates(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "lagwatch.example.yaml"
    assert main(["validate", "-c", str(example)]) == 0, capsys.readouterr().err
    config = load_config(example)
    assert [r.name for r in config.clusters[0].replicas] == ["replica1", "replica2"]


POOL_EXAMPLE = ISSUE_EXAMPLE + """\
    sla:
      max_lag: 2s
      p95: 500ms
      eject_after: 2
      readmit_below: 1s
      readmit_after: 5
      min_replicas: 1
    pooler:
      kind: pgbouncer
      admin_dsn: "host=127.0.0.1 port=56432 user=pgbouncer dbname=pgbouncer"
      include_file: /etc/pgbouncer/lagwatch-replicas.ini
      database: app_ro
      options: "port=55432 dbname=postgres"
"""


def test_issue_pool_example_loads_as_written(tmp_path: Path) -> None:
    cluster = load_config(write(tmp_path, POOL_EXAMPLE)).clusters[0]
    assert cluster.pooler is not None and cluster.pooler.kind == "pgbouncer"
    sla = cluster.replica_sla("replica1")
    assert (sla.max_lag, sla.p95, sla.eject_after, sla.readmit_below, sla.readmit_after) == (2.0, 0.5, 2, 1.0, 5)
    assert cluster.sla.min_replicas == 1


def test_replica_sla_override_must_be_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = ISSUE_EXAMPLE.replace("      - name: replica2\n", "      - name: replica2\n        sla: {max_lag: 0s}\n")
    assert main(["validate", "-c", str(write(tmp_path, text))]) == 2
    assert "clusters[0].replicas[1].sla: max_lag must be greater than 0" in capsys.readouterr().err


def test_haproxy_pooler_and_replica_sla_override(tmp_path: Path) -> None:
    text = ISSUE_EXAMPLE.replace('''      - name: replica2
''', '''      - name: replica2
        sla: {max_lag: 5s}
''') + """\
    pooler: {kind: haproxy, socket: /run/haproxy/admin.sock, backend: pg_ro, servers: {replica1: r1, replica2: r2}}
"""
    cluster = load_config(write(tmp_path, text)).clusters[0]
    assert cluster.replica_sla("replica2").max_lag == 5.0
    assert cluster.replica_sla("replica2").readmit_below == 2.5
    assert cluster.replica_sla("replica1").max_lag == 10.0


@pytest.mark.parametrize("pool_yaml,needle", [
    ("    pooler: {kind: pgcat}\n", "clusters[0].pooler.config_file: required key is missing"),
    ("    pooler: {kind: nosuch}\n", "clusters[0].pooler:"),
    ("    pooler: {kind: haproxy, socket: /s, backend: b, servers: {ghost: g}}\n", "unknown replicas: ghost"),
    ("    sla: {max_lag: 1s, readmit_below: 2s}\n", "readmit_below must not be above max_lag"),
    ("    sla: {eject_after: 0}\n", "clusters[0].sla.eject_after:"),
    ("    sla: {readmit_below: 0s}\n", "readmit_below must be greater than 0"),
    ("    pooler: {kind: pgbouncer, admin_dsn: 'host=a = =', include_file: /f, database: ro}\n",
     "clusters[0].pooler.admin_dsn: not a valid libpq connection string"),
    ("    pooler: {kind: pgbouncer, admin_dsn: 'host=a', include_file: /f, database: \"ro\\nx = y\"}\n",
     "clusters[0].pooler.database: 'ro\\nx = y' is not a PgBouncer database name"),
    # What the adapters would refuse at run time is refused here: validate agrees with run.
    ("    pooler: {kind: haproxy, socket: /s, backend: 'pg_read;disable server pg_read/pg1', servers: {}}\n",
     "clusters[0].pooler.backend: 'pg_read;disable server pg_read/pg1' is not an HAProxy name"),
    ("    pooler: {kind: haproxy, socket: /s, backend: b, servers: {replica1: pg1, replica2: pg1}}\n",
     "clusters[0].pooler.servers: 'replica1' and 'replica2' both map to server 'pg1'"),
    ("    pooler: {kind: command, template: '{replicas}', output_file: /o, reload_command: []}\n",
     "clusters[0].pooler.template: unknown placeholder {replicas}"),
    ("    pooler: {kind: pgbouncer, admin_dsn: 'host=a', admin_password_file: /nonexistent, include_file: /f,"
     " database: ro}\n", "clusters[0].pooler: admin_password_file '/nonexistent' is not a readable file"),
])
def test_bad_pool_config(tmp_path: Path, capsys: pytest.CaptureFixture[str], pool_yaml: str, needle: str) -> None:
    assert main(["validate", "-c", str(write(tmp_path, ISSUE_EXAMPLE + pool_yaml))]) == 2
    assert needle in capsys.readouterr().err


def test_haproxy_fallback_to_primary_needs_a_primary_server() -> None:
    cluster = {"name": "m", "primary": {"dsn": "host=a"}, "replicas": [{"name": "r1", "dsn": "host=b"}],
               "sla": {"fallback_to_primary": True},
               "pooler": {"kind": "haproxy", "socket": "/run/haproxy/admin.sock", "backend": "pg_ro",
                          "servers": {"r1": "pg1"}}}
    found = problems({"clusters": [cluster]})
    assert any(p.startswith("clusters[0]: sla.fallback_to_primary needs a 'primary' entry in pooler.servers")
               for p in found), found
    cluster["pooler"]["servers"]["primary"] = "pg0"  # type: ignore[index]
    parse_config({"clusters": [cluster]})


@pytest.mark.parametrize("dsn", ["host=a port=abc", "host=a,b port=5432,99999", "postgresql://h:0/db"])
def test_bad_port_in_dsn(dsn: str) -> None:
    found = problems({"clusters": [{"name": "m", "primary": {"dsn": dsn}}]})
    assert any(p.startswith("clusters[0].primary.dsn:") and "is not a TCP port number" in p for p in found), found


@pytest.mark.parametrize("seconds,text", [(0.0, "0ms"), (0.0004, "0.4ms"), (0.0072, "7.2ms"), (0.0635, "64ms"),
                                          (0.25, "250ms"), (1.0, "1s"), (1.254, "1.25s"), (2.0, "2s"),
                                          (12.0, "12s"), (90.0, "90s"), (150.0, "2.5m"), (7200.0, "2h")])
def test_durations_are_shown_to_the_millisecond(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("line,needle", [
    ("interval: .inf", "interval: must be a finite number of seconds"),
    ("interval: .nan", "interval: must be a finite number of seconds"),
    ("window: -.inf", "window: must be a finite number of seconds"),
    ("query_timeout: .nan", "query_timeout: must be a finite number of seconds"),
    ("interval: " + "9" * 400, "interval: must be a finite number of seconds, got 9999"),  # float() overflows
])
def test_durations_must_be_finite(tmp_path: Path, line: str, needle: str) -> None:
    key = line.split(":")[0]
    rest = "\n".join(x for x in ISSUE_EXAMPLE.splitlines() if not x.startswith(key + ":"))
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, line + "\n" + rest + "\n"))
    assert any(p.startswith(needle) for p in info.value.problems), info.value.problems


def test_a_pooled_node_needs_one_host_and_port(tmp_path: Path) -> None:
    text = ISSUE_EXAMPLE.replace('dsn: "host=127.0.0.3 port=55432', 'dsn: "host=127.0.0.3,127.0.0.4 port=55432') + (
        "    pooler: {kind: haproxy, socket: /s, backend: b, servers: {replica1: r1}}\n")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert any("replicas[1].dsn: with a pooler each node the pool may route to needs one host" in p
               for p in info.value.problems)
    load_config(write(tmp_path, ISSUE_EXAMPLE.replace('host=127.0.0.3 port', 'host=127.0.0.3,127.0.0.4 port')))


def test_a_multi_host_primary_dsn_goes_with_a_pooler_unless_the_pool_may_route_to_the_primary() -> None:
    def config(sla: dict[str, Any]) -> dict[str, Any]:
        return {"clusters": [{"name": "c", "sla": sla,
                              "primary": {"dsn": "host=a,b,c port=5432,5432,5433 target_session_attrs=read-write"},
                              "replicas": [{"name": "r1", "dsn": "host=b"}, {"name": "r2", "dsn": "host=c port=5433"}],
                              "pooler": {"kind": "pgbouncer", "admin_dsn": "host=pgb port=6432 user=pgbouncer",
                                         "include_file": "/etc/pgbouncer/ro.ini", "database": "app_ro"}}]}
    parse_config(config({}))  # the writer is found among three hosts; reads go to r1 and r2
    with pytest.raises(ConfigError) as info:
        parse_config(config({"fallback_to_primary": True}))
    assert any("primary.dsn: with a pooler each node the pool may route to needs one host" in p
               for p in info.value.problems), info.value.problems


def test_an_unquoted_off_says_yaml_read_it_as_false(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``lag_from_wal: off`` written without quotes is YAML's false: the error says so,
    rather than only that the value should be 'auto' or 'off' (which is what was written)."""
    path = tmp_path / "lagwatch.yaml"
    path.write_text("listen: 127.0.0.1:9\nclusters:\n  - name: a\n    primary: {dsn: host=p}\n"
                    "    lag_from_wal: off\n    walinspect: 'off'\n")
    assert main(["validate", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "clusters[0].lag_from_wal: Input should be 'auto' or 'off' (YAML reads an unquoted off, no, on or yes " \
           "as false: quote the word, as in 'off')" in err
    assert "walinspect" not in err  # quoted, it is the word
