"""A corpus of config files, good and bad, for showing that validate, check, run and a
reload agree on every one of them.

Good: every YAML example in the README, docs/ and deploy/, the deploy example with every option
switched on, and one config per pooler kind. Bad: each a good config with one thing wrong
(durations that are NaN, infinite, negative or zero, unknown keys at every level, bad
adapter options, missing and unreadable files, a broken web config...), with the text of
the problem it must be reported with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import yaml

ROOT = Path(__file__).resolve().parents[2]
SECRET = "S3cretInADsnTypo"  # must never be printed, logged or served


@dataclass(frozen=True)
class Case:
    name: str
    path: Path
    good: bool
    needle: str = ""  # for a bad one: what the problem says (path included)


def _dump(folder: Path, name: str, data: dict[str, Any] | str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def _base(listen_port: int, dsn: str) -> dict[str, Any]:
    return {
        "interval": "1s",
        "window": "10s",
        "listen": f"127.0.0.1:{listen_port}",
        "clusters": [{
            "name": "main",
            "primary": {"dsn": dsn},
            "replicas": [{"name": "replica1", "dsn": dsn.replace("127.0.0.1", "127.0.0.2")},
                         {"name": "replica2", "dsn": dsn.replace("127.0.0.1", "127.0.0.3")}],
        }],
    }


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``data`` with ``dotted`` (``clusters.0.sla.max_lag``) set."""
    out: dict[str, Any] = yaml.safe_load(yaml.safe_dump(data))
    *parents, last = dotted.split(".")
    node: Any = out
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    if isinstance(node, list) and int(last) == len(node):
        node.append(value)
    else:
        node[int(last) if last.isdigit() else last] = value
    return out


def uncommented(text: str) -> str:
    """The example with every optional setting switched on: "#key: ..." lines, and the
    "#  key: ..." lines of a block right below one."""
    out, in_block = [], False
    for line in text.splitlines():
        match = re.match(r"^(\s*)#(\S.*|\s+[a-z_][a-z0-9_]*:.*)$", line)
        if match and (not match.group(2)[0].isspace() or in_block):
            out.append(match.group(1) + match.group(2))
            in_block = True
        else:
            out.append(line)
            in_block = False
    return "\n".join(out) + "\n"


def readme_examples() -> list[str]:
    """The YAML blocks of the README and docs/ that are whole lagwatch configs."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    blocks = [b for page in pages for b in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)]
    return [b for b in blocks if re.search(r"^clusters:", b, re.M)]


def build(folder: Path, listen_port: int, dsn: str = "host=127.0.0.1 port=1 user=postgres dbname=postgres",
          poolers: dict[str, dict[str, Any]] | None = None) -> list[Case]:
    """Write the corpus into ``folder``. ``dsn`` is where the good ones point (a port
    nothing listens on by default: they are about accepting the file, not about polling).
    ``poolers``: extra pooler sections to include as good cases, by name."""
    folder.mkdir(parents=True, exist_ok=True)
    cases: list[Case] = []

    def good(name: str, data: dict[str, Any] | str) -> None:
        cases.append(Case(name, _dump(folder, name, data), True))

    def bad(name: str, data: dict[str, Any] | str, needle: str) -> None:
        cases.append(Case(name, _dump(folder, name, data), False, needle))

    base = _base(listen_port, dsn)
    good("base", base)
    for i, text in enumerate(readme_examples()):
        good(f"readme-{i}", text)
    example = (ROOT / "deploy" / "lagwatch.example.yaml").read_text()
    good("deploy-example", example)
    web = folder / "web.yml"
    hashed = bcrypt.hashpw(b"corpus", bcrypt.gensalt(rounds=4)).decode()
    web.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": hashed},
                                   "http_server_config": {"headers": {"X-Frame-Options": "deny"}}}))
    good("deploy-example-everything", uncommented(example).replace("/etc/lagwatch/web.yml", str(web)))
    good("with-web-config", _set(base, "web_config_file", str(web)))

    include_dir = folder / "pgbouncer"
    include_dir.mkdir(exist_ok=True)
    toml_file = folder / "pgcat.toml"
    toml_file.write_text("[pools.app]\n")
    kinds: dict[str, dict[str, Any]] = {
        "pgbouncer": {"kind": "pgbouncer", "admin_dsn": "host=127.0.0.1 port=1 user=pgbouncer dbname=pgbouncer",
                      "include_file": str(include_dir / "replicas.ini"), "database": "app_ro",
                      "options": "port=5432 dbname=app"},
        "haproxy": {"kind": "haproxy", "socket": str(folder / "haproxy.sock"), "backend": "pg_ro",
                    "servers": {"replica1": "r1", "replica2": "r2"}},
        "pgcat": {"kind": "pgcat", "config_file": str(toml_file), "pool": "app", "reload_command": []},
        "pgdog": {"kind": "pgdog", "config_file": str(toml_file), "pool": "app", "reload_command": ["true"]},
        "command": {"kind": "command", "template": "hosts = {hosts}\n", "output_file": str(folder / "out.conf"),
                    "reload_command": ["true"]},
        **(poolers or {}),
    }
    for kind, pooler in kinds.items():
        good(f"pooler-{kind}", _set(base, "clusters.0.pooler", pooler))

    # -- bad: durations -------------------------------------------------------------------
    for key in ("interval", "window", "connect_timeout", "query_timeout", "reconnect_backoff_max"):
        for label, value, needle in (("nan", float("nan"), "must be a finite number"),
                                     ("inf", float("inf"), "must be a finite number"),
                                     ("negative", "-1s", "must not be negative")):
            bad(f"{key}-{label}", _set(base, key, value), f"{key}: {needle}")
    bad("interval-zero", _set(base, "interval", 0), "interval: must be greater than 0")
    bad("window-zero", _set(base, "window", "0s"), "window: must be greater than 0")
    bad("interval-words", _set(base, "interval", "one second"), "interval: expected a duration")
    for key in ("max_lag", "p95", "readmit_below"):
        bad(f"sla-{key}-nan", _set(base, f"clusters.0.sla.{key}", float("nan")),
            f"clusters[0].sla.{key}: must be a finite number")
        bad(f"sla-{key}-zero", _set(base, f"clusters.0.sla.{key}", "0s"), "must be greater than 0")
    bad("replica-sla-inf", _set(base, "clusters.0.replicas.0.sla", {"max_lag": float("inf")}),
        "clusters[0].replicas[0].sla.max_lag: must be a finite number")
    bad("eject-after-zero", _set(base, "clusters.0.sla.eject_after", 0), "clusters[0].sla.eject_after:")

    # -- bad: keys and values ---------------------------------------------------------------
    bad("unknown-top", _set(base, "intervall", "1s"), "intervall: unknown key")
    bad("unknown-cluster", _set(base, "clusters.0.replica", []), "clusters[0].replica: unknown key")
    bad("unknown-node", _set(base, "clusters.0.primary.sslmode", "require"), "clusters[0].primary.sslmode: unknown key")
    bad("unknown-sla", _set(base, "clusters.0.sla.max_lagg", "1s"), "clusters[0].sla.max_lagg: unknown key")
    bad("unknown-pooler-key", _set(base, "clusters.0.pooler", {**kinds["haproxy"], "server": {}}),
        "clusters[0].pooler.server: unknown key")
    bad("no-clusters", {"interval": "1s", "clusters": []}, "clusters: at least one cluster is needed")
    bad("clusters-missing", {"interval": "1s"}, "clusters: at least one cluster is needed (or a clusters_dir)")
    bad("listen-bad", _set(base, "listen", "localhost"), "listen:")
    bad("listen-port", _set(base, "listen", "127.0.0.1:99999"), "listen:")
    bad("replica-named-primary", _set(base, "clusters.0.replicas.0.name", "primary"), "reserved")
    bad("dsn-application-name", _set(base, "clusters.0.primary.dsn", dsn + " application_name=x"),
        "clusters[0].primary.dsn: must not set application_name")
    bad("dsn-port", _set(base, "clusters.0.replicas.1.dsn", "host=127.0.0.3 port=99999"),
        "clusters[0].replicas[1].dsn: port '99999' is not a TCP port number")
    bad("dsn-garbage", _set(base, "clusters.0.primary.dsn", "host=a = ="), "not a valid libpq connection string")
    bad("duplicate-clusters", _set(base, "clusters.1", base["clusters"][0]), "cluster names must be unique")
    bad("window-below-interval", _set(_set(base, "interval", "10s"), "window", "5s"), "window must be at least")
    bad("readmit-above-max", _set(_set(base, "clusters.0.sla.max_lag", "1s"), "clusters.0.sla.readmit_below", "2s"),
        "readmit_below must not be above max_lag")
    bad("not-a-mapping", "- just\n- a list\n", "(top level): expected a mapping")
    bad("not-yaml", "clusters: [\n", "not valid YAML")
    bad("walinspect-bad", _set(base, "clusters.0.walinspect", "on"), "clusters[0].walinspect:")

    # -- bad: hostile text (no traceback, no echo of a secret, one line per problem) ------------
    bad("dsn-typo-with-password", _set(base, "clusters.0.primary.dsn", f"lagwatch:{SECRET}@db:5432/postgres"),
        "clusters[0].primary.dsn: not a valid libpq connection string (a word without \"=\")")
    bad("nested-1000-deep", "clusters:\n  - " + "[" * 1000 + "]" * 1000 + "\n", "nested more than 64 levels deep")
    bad("integer-5000-digits", yaml.safe_dump(_set(base, "interval", "HUGE")).replace("HUGE", "9" * 5000),
        "a value cannot be read: Exceeds the limit (4300 digits)")
    bad("control-characters", _set(base, "bad\x1b[2J\nkey", 1), "bad\\x1b[2J\\nkey: unknown key")
    not_utf8 = yaml.safe_dump(base).encode().replace(b"interval:", b"# caf\xe9\ninterval:", 1)
    cases.append(Case("not-utf8", folder / "not-utf8.yaml", False,
                      f"not UTF-8: byte 0xe9 at offset {not_utf8.index(0xE9)} (line "))
    cases[-1].path.write_bytes(not_utf8)

    # -- bad: pooler options (what an adapter would refuse at run time) ---------------------
    bad("haproxy-name", _set(base, "clusters.0.pooler", {**kinds["haproxy"], "backend": "pg ro"}),
        "clusters[0].pooler.backend: 'pg ro' is not an HAProxy name")
    bad("haproxy-same-server", _set(base, "clusters.0.pooler", {**kinds["haproxy"],
                                                                 "servers": {"replica1": "r", "replica2": "r"}}),
        "both map to server 'r'")
    bad("haproxy-ghost", _set(base, "clusters.0.pooler", {**kinds["haproxy"], "servers": {"ghost": "g"}}),
        "unknown replicas: ghost")
    bad("haproxy-fallback", _set(_set(base, "clusters.0.pooler", kinds["haproxy"]),
                                 "clusters.0.sla.fallback_to_primary", True), "needs a 'primary' entry")
    bad("command-placeholder", _set(base, "clusters.0.pooler", {**kinds["command"], "template": "{servers}"}),
        "clusters[0].pooler.template: unknown placeholder {servers}")
    bad("command-positional", _set(base, "clusters.0.pooler", {**kinds["command"], "template": "{}"}),
        "clusters[0].pooler.template: positional placeholder")
    bad("command-unclosed", _set(base, "clusters.0.pooler", {**kinds["command"], "template": "{hosts"}),
        "clusters[0].pooler.template: not a valid format string")
    bad("pgbouncer-newline", _set(base, "clusters.0.pooler", {**kinds["pgbouncer"], "database": "ro\nx = y"}),
        "clusters[0].pooler.database: 'ro\\nx = y' is not a PgBouncer database name")
    bad("pgbouncer-options-host", _set(base, "clusters.0.pooler", {**kinds["pgbouncer"],
                                                                   "options": "host=evil port=1"}),
        "clusters[0].pooler.options: PgBouncer database entries do not take host (lagwatch writes host= itself)")
    bad("pgbouncer-options-unknown", _set(base, "clusters.0.pooler", {**kinds["pgbouncer"],
                                                                      "options": "port=1 admin_users=mallory"}),
        "clusters[0].pooler.options: PgBouncer database entries do not take admin_users")
    bad("pooled-host-injection", _set(_set(base, "clusters.0.pooler", kinds["pgbouncer"]), "clusters.0.replicas.1.dsn",
                                      "host='127.0.0.3\n[pgbouncer]\nadmin_users = mallory' port=1"),
        "replicas[1].dsn: host '127.0.0.3\\n[pgbouncer]\\nadmin_users = mallory' cannot be written "
        "into a pooler config")
    bad("pgbouncer-when-empty", _set(base, "clusters.0.pooler", {**kinds["pgbouncer"], "when_empty": "nothing"}),
        "clusters[0].pooler.when_empty:")
    bad("pooler-kind", _set(base, "clusters.0.pooler", {"kind": "odyssey"}), "clusters[0].pooler:")
    bad("toml-command", _set(base, "clusters.0.pooler", {**kinds["pgcat"], "reload_command": "kill -HUP 1"}),
        "clusters[0].pooler.reload_command:")
    bad("pooled-multi-host", _set(_set(base, "clusters.0.pooler", kinds["haproxy"]), "clusters.0.replicas.1.dsn",
                                  "host=127.0.0.3,127.0.0.4 port=1"),
        "with a pooler each node the pool may route to needs one host")

    # -- bad: files ---------------------------------------------------------------------------
    missing = str(folder / "no-such-file")
    bad("password-file-missing", _set(base, "clusters.0.primary.password_file", missing), "is not a readable file")
    bad("admin-password-file-missing", _set(base, "clusters.0.pooler",
                                            {**kinds["pgbouncer"], "admin_password_file": missing}),
        "admin_password_file")
    bad("both-password-sources", _set(_set(base, "clusters.0.primary.password_file", str(web)),
                                      "clusters.0.primary.password_env", "PGPASSWORD"), "set at most one of")
    bad("web-config-missing", _set(base, "web_config_file", missing), "web_config_file (")
    webs = {
        "web-not-yaml": "basic_auth_users: [\n",
        "web-unknown-key": "basic_auth_user: {}\n",
        "web-plain-password": "basic_auth_users: {prometheus: secret}\n",
        "web-bcrypt-cost-03": "basic_auth_users: {prometheus: '$2b$03$" + "a" * 53 + "'}\n",
        "web-bcrypt-cost-99": "basic_auth_users: {prometheus: '$2b$99$" + "a" * 53 + "'}\n",
        "web-missing-cert": f"tls_server_config: {{cert_file: {missing}, key_file: {missing}}}\n",
        "web-bad-header": "http_server_config: {headers: {X-Powered-By: me}}\n",
        "web-header-not-ascii": "http_server_config: {headers: {Content-Security-Policy: \"default-src caf\u00e9\"}}\n",
        "web-bcrypt-cost-17": "basic_auth_users: {prometheus: '$2b$17$" + "a" * 53 + "'}\n",
        "web-not-utf8": "basic_auth_users: {}\n# \udcff\n",
    }
    for name, text in webs.items():
        path = folder / f"{name}.yml"
        path.write_bytes(text.encode(errors="surrogateescape"))
        bad(name, _set(base, "web_config_file", str(path)), f"web_config_file ({path}):")
    return cases

