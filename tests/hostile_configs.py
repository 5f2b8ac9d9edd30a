"""A seeded generator of hostile config and web config files, for the fuzz test (a fixed
seed, a few hundred cases per run) and `bench/fuzz.py` (as many as you like).

Each case starts from a good file and breaks it the ways a careless operator or an
attacker would: wrong types, NaN and huge numbers, control characters and unicode in keys
and values, deep nesting, YAML aliases, bytes that are not UTF-8, truncation, and paths to
things that are not files (a FIFO, /dev/zero, a directory).
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HASH = "$2b$04$" + "J" * 53  # cost 4, well-formed; nobody logs in during a fuzz run
# A secret in every shape an operator might put one where it does not belong (a URI's
# password with a delimiter in it, a token as a URL's user, path, query or fragment, an
# Azure-style user@server name): whatever key it lands under, no output may show it.
SECRET = "FuzzS3cret"
SECRET_SHAPED = [f"postgresql://u:{SECRET}@h/db", f"postgresql://u:{SECRET}@x@127.0.0.1/db",
                 f"postgresql://u:{SECRET}/x@h/db", f"postgresql://lagwatch@srv:{SECRET}@db.example.com:5432/p",
                 f"password={SECRET}", f"host=h password='{SECRET} x'", f"https://{SECRET}@h:8008",
                 f"https://u:{SECRET}@h:8008", f"https://h:8008/{SECRET}/", f"https://h:8008?token={SECRET}",
                 f"https://h:8008#{SECRET}", f"https://[u:{SECRET}]@h:8008"]

CONFIG_KEYS = ["interval", "window", "listen", "connect_timeout", "query_timeout", "reconnect_backoff_max",
               "state_dir", "web_config_file", "clusters", "name", "primary", "replicas", "dsn", "password_file",
               "password_env", "sla", "max_lag", "p95", "readmit_below", "eject_after", "fallback_to_primary",
               "pooler", "kind", "admin_dsn", "include_file", "database", "options", "socket", "backend",
               "servers", "template", "output_file", "reload_command", "config_file", "pool", "walinspect",
               # round three's: what it added or made stricter
               "conflict_query_text", "lag_from_wal", "horizon_alert_xids", "heartbeat", "table", "id",
               "discovery", "urls", "members", "username", "clusters_dir", "application_name"]
WEB_KEYS = ["tls_server_config", "cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
            "max_version", "cipher_suites", "curve_preferences", "basic_auth_users", "http_server_config",
            "headers", "http2", "Strict-Transport-Security", "X-Frame-Options", "Content-Security-Policy"]
POOLERS = ["pgbouncer", "haproxy", "pgcat", "pgdog", "command", "odyssey", ""]


@dataclass(frozen=True)
class Case:
    kind: str  # "config" or "web"
    mutations: tuple[str, ...]
    data: bytes


class Generator:
    def __init__(self, seed: int, folder: Path) -> None:
        self.rng = random.Random(seed)
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        fifo = folder / "fifo"
        if not fifo.exists():
            os.mkfifo(fifo)
        (folder / "a-directory").mkdir(exist_ok=True)
        self.paths = [str(fifo), "/dev/zero", "/dev/null", str(folder / "a-directory"), str(folder / "missing"),
                      "relative/path", "", "\x00", "/" + "x" * 5000]

    # -- values ------------------------------------------------------------------------------

    def text(self) -> str:
        rng = self.rng
        pieces = ["1s", "100ms", "-1s", "0", "nan", "inf", "1e309s", "99999999999999h", "host=a", "host=a\nb=c",
                  "lagwatch:S3cret@db/postgres", "postgresql://u:p@h:99999/db", "{hosts}", "{0}", "{", "ü",
                  "\u202e", "\x1b[2J", "\r\n", "\t", "\x7f", "\ud7ff", "a" * rng.choice([1, 100, 10_000]),
                  "$2y$31$" + "a" * 53, HASH, "'", '"', "\\", "%s", "127.0.0.1:0", "[::1]:9", "*:*",
                  "off", "on", "yes", *SECRET_SHAPED]
        return "".join(rng.choice(pieces) for _ in range(rng.randint(1, 3)))

    def value(self, depth: int = 0) -> Any:
        rng = self.rng
        choice = rng.randrange(12)
        if choice == 0:
            return rng.choice([0, -1, 1, 2**31, 2**63, 10**rng.randint(1, 400)])
        if choice == 1:
            return rng.choice([float("nan"), float("inf"), float("-inf"), -0.0, 1e-300, 1e300])
        if choice == 2:
            return rng.choice([True, False, None])
        if choice == 3:
            return rng.choice(self.paths)
        if choice == 4 and depth < 4:
            return [self.value(depth + 1) for _ in range(rng.randint(0, 3))]
        if choice == 5 and depth < 4:
            return {self.key(): self.value(depth + 1) for _ in range(rng.randint(0, 3))}
        if choice == 6:
            return rng.choice(POOLERS)
        return self.text()

    def key(self) -> str:
        rng = self.rng
        return rng.choice(CONFIG_KEYS + WEB_KEYS) if rng.random() < 0.8 else self.text()

    # -- files ---------------------------------------------------------------------------------

    def base_config(self) -> dict[str, Any]:
        pooler = self.rng.choice([None, {"kind": "haproxy", "socket": str(self.folder / "sock"), "backend": "ro",
                                         "servers": {"r1": "r1"}},
                                  {"kind": "command", "template": "{hosts}\n", "output_file": str(self.folder / "o"),
                                   "reload_command": ["true"]}])
        cluster: dict[str, Any] = {"name": "main", "primary": {"dsn": "host=127.0.0.1 port=1"},
                                   "replicas": [{"name": "r1", "dsn": "host=127.0.0.2 port=1"}],
                                   "sla": {"max_lag": "100ms"}}
        if pooler is not None:
            cluster["pooler"] = pooler
        return {"interval": "1s", "listen": "127.0.0.1:9", "state_dir": str(self.folder / "state"),
                "clusters": [cluster]}

    def base_web(self) -> dict[str, Any]:
        return {"basic_auth_users": {"prometheus": HASH},
                "http_server_config": {"headers": {"X-Frame-Options": "deny"}}}

    def case(self) -> Case:
        rng = self.rng
        kind = "web" if rng.random() < 0.3 else "config"
        data: Any = self.base_web() if kind == "web" else self.base_config()
        done: list[str] = []
        for _ in range(rng.randint(1, 3)):
            op = rng.choice(["set", "set", "set", "delete", "replace-root"])
            if op == "replace-root":
                data = self.value()
                done.append("replace-root")
                continue
            container, where = self._pick(data)
            if container is None:
                continue
            if op == "delete" and isinstance(container, dict) and container:
                container.pop(rng.choice(list(container)))
                done.append(f"delete {where}")
            elif isinstance(container, dict):
                container[rng.choice(list(container) + [self.key()])] = self.value()
                done.append(f"set {where}")
            elif isinstance(container, list) and container:
                container[rng.randrange(len(container))] = self.value()
                done.append(f"set {where}[]")
        try:
            text = yaml.safe_dump(data, allow_unicode=rng.random() < 0.5)
        except (ValueError, yaml.YAMLError):
            text = "{}\n"
        raw = text.encode("utf-8", errors="surrogatepass")
        for _ in range(rng.choice([0, 0, 1, 2])):
            raw, what = self._corrupt(raw)
            done.append(what)
        return Case(kind, tuple(done), raw)

    def _pick(self, data: Any) -> tuple[Any, str]:
        node, where = data, "(root)"
        for _ in range(self.rng.randint(0, 4)):
            if isinstance(node, dict) and node:
                key = self.rng.choice(list(node))
                if not isinstance(node[key], (dict, list)):
                    break
                node, where = node[key], f"{where}.{key}"
            elif isinstance(node, list) and node:
                child = self.rng.choice(node)
                if not isinstance(child, (dict, list)):
                    break
                node, where = child, f"{where}[]"
        return (node if isinstance(node, (dict, list)) else None), where

    def _corrupt(self, raw: bytes) -> tuple[bytes, str]:
        rng = self.rng
        # A place drawn as a fraction, not by randrange(len(raw)), which draws more or fewer
        # bits as the length changes: the files hold the test's own folder, and a seed gave
        # other cases wherever that folder's name was another length.
        at = _place(rng, len(raw) + 1)
        op = rng.randrange(7)
        if op == 0:
            junk = bytes(rng.choice([0x00, 0x07, 0x1B, 0x7F, 0x80, 0xC3, 0xE9, 0xFF, 0x0A, 0x3A, 0x5B, 0x7B])
                         for _ in range(rng.randint(1, 4)))
            return raw[:at] + junk + raw[at:], "insert bytes"
        if op == 1:
            return raw[:at], "truncate"
        if op == 2:
            depth = rng.choice([10, 70, 1000, 5000])
            return raw + b"\ndeep: " + b"[" * depth + b"]" * depth + b"\n", f"nest {depth}"
        if op == 3:
            digits = rng.choice([100, 4301, 10_000])
            return re.sub(rb"interval: \S+", b"interval: " + b"9" * digits, raw, count=1), f"int {digits} digits"
        if op == 4:
            laughs = b"a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
                b"%c: &%c [%s]\n" % (98 + i, 98 + i, b", ".join([b"*%c" % (97 + i)] * 9)) for i in range(8))
            return laughs + raw, "aliases"
        if op == 5:
            lines = raw.split(b"\n")
            i = _place(rng, len(lines))
            lines[i] = b" " * rng.randint(1, 5) + lines[i]
            return b"\n".join(lines), "indent"
        return raw + b"\n" + rng.choice([b"\t: x", b"? [a, b]\n: 1", b"!!python/object:os.system x",
                                         b"%YAML 9.9\n---", b"\xef\xbb\xbf"]), "yaml oddity"


    # -- what the other doors let in: Patroni's answers, clusters_dir's files ---------------

    def name(self) -> str:
        """A member or file name as an attacker picks it."""
        return self.rng.choice(["m1", "primary", "", "a\nERROR forged", "b\x1b[31m", "c\u2028d", "\u202eevil",
                                "../../etc/passwd", "x" * self.rng.choice([128, 129, 5000]), "ü", "%s{0}",
                                "\x00nul", "spaces in it", "a/b"])

    def member(self) -> Any:
        rng = self.rng
        member: dict[str, Any] = {"name": self.name(), "role": rng.choice(["leader", "replica", "sync_standby", 7]),
                                  "state": "running", "host": rng.choice(["127.0.0.1", "", "h\nx", None, 5]),
                                  "port": rng.choice([5432, 0, 65536, -1, "5432", 2**70, None])}
        for _ in range(rng.randint(0, 2)):
            member[self.key()] = self.value()
        if rng.random() < 0.2:
            member["tags"] = rng.choice([{"noloadbalance": self.value()}, "tags", [1], {"nofailover": True}])
        return member if rng.random() < 0.9 else self.value()

    def patroni_answer(self) -> bytes:
        """A ``GET /cluster`` answer: a member list bent out of shape, or not JSON at all."""
        rng = self.rng
        shape = rng.randrange(6)
        if shape == 0:  # many members: past the cap, or just under it
            count = rng.choice([33, 4000, 20_000])
            body: Any = {"members": [{"name": f"m{i}", "host": "127.0.0.1", "port": 1 + i % 60000}
                                     for i in range(count)]}
        elif shape == 1:
            body = rng.choice([[], {}, {"members": {}}, {"members": None}, "members", 1e309, {"members": [[]]}])
        elif shape == 2:
            return b'{"members": ' + b"[" * rng.choice([100, 5000]) + b"]" * 5000 + b"}"
        elif shape == 3:
            return rng.choice([b"\xff\xfe{", b'{"members": [{"name": "\xc3"}]}', b"", b"null", b"<html>"])
        else:
            body = {"members": [self.member() for _ in range(rng.randint(0, 5))]}
        try:
            return json.dumps(body).encode()
        except (ValueError, TypeError):
            return b"{}"

    def cluster_file(self) -> tuple[str, bytes]:
        """A clusters_dir file: its name and its bytes (a cluster's keys, bent as ``case``
        bends the main config)."""
        rng = self.rng
        cluster: Any = {"primary": {"dsn": "host=127.0.0.1 port=1"},
                        "replicas": [{"name": "r1", "dsn": "host=127.0.0.2 port=1"}]}
        for _ in range(rng.randint(0, 3)):
            container, _ = self._pick(cluster)
            if isinstance(container, dict):
                container[rng.choice(list(container) + [self.key()])] = self.value()
        try:
            raw = yaml.safe_dump(cluster, allow_unicode=True).encode("utf-8", errors="surrogatepass")
        except (ValueError, yaml.YAMLError):
            raw = b"{}\n"
        if rng.random() < 0.3:
            raw, _ = self._corrupt(raw)
        name = self.name().replace("/", "_").replace("\x00", "_") or "empty"
        return name[:200] + rng.choice([".yaml", ".yml"]), raw


PROBLEMS = re.compile(r"^(?P<source>.+): (?P<count>\d+) problem\(s\)$")


def check_output(code: int, stderr: str) -> str | None:
    """What is wrong with a `lagwatch validate` outcome, or None: exit 0, or exit 2 with a
    header line and exactly one printable line per problem."""
    if "Traceback" in stderr:
        return "traceback"
    if SECRET in stderr:
        return "a secret echoed"
    if code == 0:
        return None
    if code != 2:
        return f"exit {code}"
    lines = stderr.rstrip("\n").split("\n")
    match = PROBLEMS.match(lines[0])
    if match is None:
        return f"no header line: {lines[0][:200]!r}"
    if len(lines) != 1 + int(match["count"]) or not all(line.startswith("  ") for line in lines[1:]):
        return f"{match['count']} problem(s) but {len(lines) - 1} line(s)"
    if not all(line.isprintable() for line in lines):
        return "a line with control characters"
    return None


def _place(rng: random.Random, count: int) -> int:
    """An index below ``count`` from exactly one draw, whatever ``count`` is."""
    return min(count - 1, int(rng.random() * count))
