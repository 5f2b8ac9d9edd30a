"""A real Patroni cluster for the tests: one etcd (the DCS) and three Patroni members, each
running its own PostgreSQL, all on loopback and free ports, all stopped afterwards.

Patroni starts PostgreSQL, so it runs as the unprivileged server user, from the venv that
tests/setup-machine.sh makes with the system's Python (this Python may sit under /root,
out of that user's reach). Only processes started here are signalled, by their PID.

Patroni's timing is at its minimums (``loop_wait`` 1 s, ``ttl`` 20 s: Patroni raises a
lower one to these), ``retry_timeout`` a little above its minimum of 3 s: a DCS call slowed
by a busy host is retried, not taken for a lost DCS (a demotion). What a test would
otherwise wait ``ttl`` for, a dead member's keys running out, ``expire`` makes happen now,
as etcd does when the ttl runs out.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import failure_logs
import yaml
from lagwatch.demo.binaries import find_binaries, run_user
from lagwatch.demo.ports import free_port

PATRONI = Path("/opt/lagwatch-test/patroni/bin/patroni")
ETCD = Path("/usr/bin/etcd")
SCOPE = "lagwatch-test"
LEADER_ROLES = ("leader", "standby_leader")
# The clusters' files (PostgreSQL's data above all) on tmpfs where there is one: they are
# thrown away after the module (fsync is off anyway), and on a busy host's disk initdb, each
# base backup and their removal took seconds (a cluster started in ~13 s, not ~9; removing
# one took 1.5-3.5 s).
WORK_ROOT = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None


def available() -> str | None:
    """Why the cluster cannot run here, or None."""
    for path in (PATRONI, ETCD):
        if not os.access(path, os.X_OK):
            return f"{path} missing (tests/setup-machine.sh installs it)"
    return None


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class RestTls:
    """A CA, a server certificate for the members' addresses and a client certificate:
    the members' REST APIs speak only HTTPS and want a client certificate signed by the CA."""

    def __init__(self, folder: Path, hosts: list[str]) -> None:
        folder.mkdir(mode=0o755)
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        _openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=lagwatch-test-ca",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
                 "-keyout", "ca.key", "-out", "ca.crt", cwd=folder)
        for name, ext in (("server", "subjectAltName=" + ",".join(f"IP:{h}" for h in hosts)
                           + "\nextendedKeyUsage=serverAuth,clientAuth\n"),
                          ("client", "subjectAltName=DNS:lagwatch\nextendedKeyUsage=clientAuth\n")):
            _openssl("req", "-new", *ec, "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                     cwd=folder)
            (folder / f"{name}.ext").write_text(ext)
            _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                     "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=folder)
        self.ca = folder / "ca.crt"
        self.server = (folder / "server.crt", folder / "server.key")
        self.client = (folder / "client.crt", folder / "client.key")
        user = run_user()
        if user.uid is not None and user.gid is not None:  # Patroni (unprivileged) reads its key
            for path in self.server:
                os.chown(path, user.uid, user.gid)

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(*map(str, self.client))
        return context


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait(what: str, predicate: Callable[[], bool], timeout: float, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:g}s")
        time.sleep(every)


class PatroniMember:
    def __init__(self, cluster: PatroniCluster, name: str, host: str, pg_port: int, tags: dict[str, Any]) -> None:
        self.cluster, self.name, self.host, self.pg_port, self.tags = cluster, name, host, pg_port, tags
        self.folder = cluster.workdir / name
        self.rest_port = free_port([host])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.rest_port}"

    def dsn(self) -> str:
        return f"host={self.host} port={self.pg_port} user=postgres dbname=postgres"

    def write_config(self) -> None:
        folder = self.folder
        folder.mkdir(mode=0o700, exist_ok=True)
        tls = self.cluster.tls
        dcs: dict[str, Any] = {
            "ttl": 20, "loop_wait": 1, "retry_timeout": 5, "maximum_lag_on_failover": 16 * 1024 * 1024,
            # A killed leader comes back as a replica: rewound, or cloned again.
            "postgresql": {"use_pg_rewind": True, "use_slots": True,
                           "parameters": {"wal_level": "replica", "hot_standby": "on",
                                          "max_wal_senders": 10, "max_replication_slots": 10,
                                          "max_connections": 50, "fsync": "off",
                                          "shared_buffers": "32MB", "wal_keep_size": "64MB"}}}
        if self.cluster.standby_of is not None:  # a standby cluster: its leader replicates from there
            host, port = self.cluster.standby_of
            dcs["standby_cluster"] = {"host": host, "port": port, "create_replica_methods": ["basebackup"]}
        config = {
            "scope": self.cluster.scope, "namespace": f"/{self.cluster.namespace}/", "name": self.name,
            "log": {"level": "WARNING"},
            "restapi": {"listen": f"{self.host}:{self.rest_port}", "connect_address": f"{self.host}:{self.rest_port}",
                        "certfile": str(tls.server[0]), "keyfile": str(tls.server[1]), "cafile": str(tls.ca),
                        "verify_client": "required"},
            # Members call each other's REST API too (a switchover asks the candidate).
            "ctl": {"certfile": str(tls.server[0]), "keyfile": str(tls.server[1]), "cacert": str(tls.ca)},
            "etcd3": {"hosts": [f"127.0.0.1:{self.cluster.etcd_port}"]},
            "bootstrap": {"dcs": dcs, "initdb": [{"encoding": "UTF8"}, {"locale": "C"}]},
            "postgresql": {
                "listen": f"{self.host}:{self.pg_port}", "connect_address": f"{self.host}:{self.pg_port}",
                "data_dir": str(folder / "data"), "bin_dir": str(self.cluster.bindir),
                "pgpass": str(folder / "pgpass"),
                "authentication": {"superuser": {"username": "postgres", "password": "lagwatch-test"},
                                   "replication": {"username": "postgres", "password": "lagwatch-test"}},
                "pg_hba": ["local all all trust", "host all all 127.0.0.0/8 trust",
                           "host replication all 127.0.0.0/8 trust"],
                "parameters": {"unix_socket_directories": str(folder)},
                # Patroni owns recovery settings: a replica's apply delay goes through it.
                "recovery_conf": self.cluster.recovery_conf.get(self.name, {}),
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
            "tags": self.tags,
        }
        (folder / "patroni.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.cluster.give_to_server_user(folder)

    def start(self) -> None:
        user = run_user()
        kwargs: dict[str, Any] = {}
        if user.uid is not None:
            kwargs = {"user": user.uid, "group": user.gid, "extra_groups": []}
        log = open(self.folder / "patroni.log", "ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PYTHON"))}
        self.proc = subprocess.Popen([str(PATRONI), str(self.folder / "patroni.yml")], stdout=log,
                                     stderr=subprocess.STDOUT, cwd=self.folder, env={**env, "HOME": str(self.folder)},
                                     start_new_session=True, **kwargs)
        log.close()
        # Patroni's log holds its PostgreSQL's too: a failed test prints its tail.
        failure_logs.watch(self, f"Patroni {self.name} {self.folder / 'patroni.log'}", self.log_tail)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM: Patroni stops its PostgreSQL and leaves the cluster (its member key goes)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def _postmaster(self) -> int | None:
        """The PID of this member's PostgreSQL if it runs: postmaster.pid's, if that process
        is a postgres of this data directory (a file left by a killed one may name a PID
        the system has since given to another process)."""
        data = self.folder / "data"
        try:
            pid = int((data / "postmaster.pid").read_text().split()[0])
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            return None
        return pid if str(data).encode() in command else None

    def _kill_patroni(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def kill(self) -> None:
        """SIGKILL Patroni and the PostgreSQL it started (its session)."""
        self._kill_patroni()
        pid = self._postmaster()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def discard(self) -> int | None:
        """For a cluster being thrown away: SIGKILL Patroni (nothing restarts PostgreSQL
        then), and an immediate shutdown of its PostgreSQL (SIGQUIT: no checkpoint, but its
        shared memory removed, where SIGKILL would leave it behind). Returns the
        postmaster's PID, to wait for (``PatroniCluster.cleanup``)."""
        self._kill_patroni()
        pid = self._postmaster()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGQUIT)
        return pid

    def freeze(self, frozen: bool) -> None:
        """SIGSTOP / SIGCONT Patroni only: its REST API stops answering, PostgreSQL goes on
        (nothing for a member that is not running)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    def rest(self, path: str, body: dict[str, Any] | None = None, timeout: float = 5) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method="GET" if body is None else "POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.cluster.tls.context()) as answer:
                raw = answer.read()
                code = answer.status
        except urllib.error.HTTPError as exc:
            raw, code = exc.read(), exc.code
        try:
            return code, json.loads(raw)
        except ValueError:
            return code, raw.decode(errors="replace")

    def log_tail(self, lines: int = 30) -> str:
        path = self.folder / "patroni.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


class PatroniCluster:
    """``with PatroniCluster(tags={"m3": {"noloadbalance": True}}) as c:`` three members on
    127.0.0.21-23 (one PostgreSQL port for all, as a pooler entry needs), one etcd.

    ``standby_of=(host, port)``: a standby cluster of that primary (its leader is Patroni's
    ``standby_leader``, streaming from there), members named s1, s2... on ``hosts``.
    ``etcd_of``: another cluster whose etcd to share (under a scope of its own; left running)."""

    def __init__(self, tags: dict[str, dict[str, Any]] | None = None, standby_of: tuple[str, int] | None = None,
                 hosts: list[str] | None = None, size: int = 3,
                 recovery_conf: dict[str, dict[str, str]] | None = None,
                 etcd_of: PatroniCluster | None = None) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="lagwatch-patroni-", dir=WORK_ROOT))
        os.chmod(self.workdir, 0o755)
        self.namespace = f"lw{os.getpid()}"
        self.bindir = find_binaries().bindir
        self.etcd_shared = etcd_of is not None
        self.etcd_port = etcd_of.etcd_port if etcd_of is not None else free_port(["127.0.0.1"])
        self.etcd_peer_port = (etcd_of.etcd_peer_port if etcd_of is not None
                               else free_port(["127.0.0.1"], exclude={self.etcd_port}))
        self.etcd: subprocess.Popen[bytes] | None = None
        self.standby_of = standby_of
        self.recovery_conf = recovery_conf or {}  # member -> recovery settings (recovery_min_apply_delay)
        self.scope = SCOPE if standby_of is None else f"{SCOPE}-standby"
        prefix = "m" if standby_of is None else "s"
        # A fourth address for a member added later (add_member).
        hosts = hosts or ["127.0.0.21", "127.0.0.22", "127.0.0.23", "127.0.0.24"]
        self.pg_port = free_port(hosts, exclude={self.etcd_port, self.etcd_peer_port})
        self.tags = tags or {}
        self.members = [PatroniMember(self, f"{prefix}{i}", host, self.pg_port, self.tags.get(f"{prefix}{i}", {}))
                        for i, host in enumerate(hosts[:size], start=1)]
        self._spare_hosts = hosts[size:]
        self.tls = RestTls(self.workdir / "tls", hosts)

    def give_to_server_user(self, path: Path) -> None:
        user = run_user()
        if user.uid is not None and user.gid is not None:
            os.chown(path, user.uid, user.gid)

    def member(self, name: str) -> PatroniMember:
        return next(m for m in self.members if m.name == name)

    def __enter__(self) -> PatroniCluster:
        try:
            self.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def start(self, timeout: float = 90) -> None:
        if not self.etcd_shared:
            etcd_dir = self.workdir / "etcd"
            peer = f"http://127.0.0.1:{self.etcd_peer_port}"
            client = f"http://127.0.0.1:{self.etcd_port}"
            log = open(self.workdir / "etcd.log", "ab")
            self.etcd = subprocess.Popen(
                [str(ETCD), "--name", "lw", "--data-dir", str(etcd_dir), "--listen-client-urls", client,
                 "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"lw={peer}", "--log-level", "error"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
        _wait("etcd answering", self._etcd_healthy, 20)
        first, *others = self.members
        first.write_config()
        first.start()  # the first bootstraps (initdb, or a copy of standby_of) and leads; the others clone from it
        # The others start as soon as the first holds the initialize key (while it bootstraps):
        # a member that finds the key taken and no leader waits for one, then clones from it.
        _wait(f"{first.name} bootstrapping", lambda: self._has_key("initialize") or first.proc is None
              or first.proc.poll() is not None, timeout)
        for member in others:
            member.write_config()
            member.start()
        self.wait_streaming(timeout)
        if self.leader() != first.name:  # its bootstrap failed and another took over
            raise RuntimeError(f"{first.name} does not lead: {self.cluster_view()}\n{first.log_tail()}")

    def add_member(self, timeout: float = 60) -> PatroniMember:
        """A new member on the spare address: it clones from the leader and streams."""
        name = f"m{len(self.members) + 1}"
        member = PatroniMember(self, name, self._spare_hosts.pop(0), self.pg_port, self.tags.get(name, {}))
        self.members.append(member)
        member.write_config()
        member.start()
        self.wait_streaming(timeout)
        return member

    def remove_member(self, name: str) -> None:
        """A member leaves for good: stopped, its keys gone at once (``expire``), forgotten."""
        self.member(name).stop()
        self.expire(name)
        self.forget(name)

    def forget(self, name: str) -> None:
        """A member stopped for good: out of the list, its folder removed, its address
        free for the next ``add_member``."""
        member = self.member(name)
        assert member.proc is None or member.proc.poll() is not None, f"{name} still runs"
        member.kill()
        failure_logs.unwatch(member)
        self.members.remove(member)
        self._spare_hosts.insert(0, member.host)
        shutil.rmtree(member.folder, ignore_errors=True)

    def _etcd(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One call to etcd's v3 JSON gateway (keys and lease IDs as etcd's JSON carries them)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.etcd_port}/v3/{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=5) as answer:
            result: dict[str, Any] = json.loads(answer.read())
            return result

    def _key(self, path: str) -> str:
        return base64.b64encode(f"/{self.namespace}/{self.scope}/{path}".encode()).decode()

    def _has_key(self, path: str) -> bool:
        try:
            return int(self._etcd("kv/range", {"key": self._key(path), "count_only": True}).get("count", 0)) > 0
        except (OSError, ValueError):
            return False

    def expire(self, name: str) -> None:
        """What etcd does ``ttl`` seconds after a dead member's last renewal, now: revoke the
        lease its keys hang on (its member key, and the leader key if it led). Patroni's
        other members see the keys gone at their next loop, as after the ttl. Only for a
        member whose Patroni no longer runs (one that runs would renew or take a new lease)."""
        member = self.member(name)
        assert member.proc is None or member.proc.poll() is not None, f"{name}'s Patroni still runs"
        found = self._etcd("kv/range", {"key": self._key(f"members/{name}")}).get("kvs", [])
        for lease in {kv.get("lease") for kv in found} - {None, "0"}:
            self._etcd("lease/revoke", {"ID": lease})

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.etcd_port}/health", timeout=2) as answer:
                return bool(json.loads(answer.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def cluster_view(self) -> dict[str, Any]:
        for member in self.members:
            if member.proc is None or member.proc.poll() is not None:
                continue
            try:
                code, body = member.rest("/cluster", timeout=2)
            except OSError:
                continue
            if code == 200 and isinstance(body, dict):
                return body
        return {"members": []}

    def leader(self) -> str | None:
        """The running leader (a standby cluster's: its standby leader, once it streams)."""
        return next((m["name"] for m in self.cluster_view()["members"] if m.get("role") in LEADER_ROLES
                     and m.get("state") in ("running", "streaming")), None)

    def wait_streaming(self, timeout: float = 60, names: set[str] | None = None) -> None:
        """Until one leader runs and every other member (of ``names``) streams from it."""
        def ready() -> bool:
            members = self.cluster_view()["members"]
            running = {m["name"] for m in members if m.get("role") in LEADER_ROLES
                       and m.get("state") in ("running", "streaming")}
            streaming = {m["name"] for m in members if m.get("role") not in LEADER_ROLES
                         and m.get("state") == "streaming"}
            want = names or {m.name for m in self.members if m.proc is not None and m.proc.poll() is None}
            return len(running) == 1 and want <= running | streaming

        try:
            _wait("Patroni members streaming", ready, timeout, 0.3)
        except TimeoutError as exc:
            logs = "\n".join(f"--- {m.name} ---\n{m.log_tail()}" for m in self.members)
            raise TimeoutError(f"{exc}; /cluster: {self.cluster_view()}\n{logs}") from None

    def switchover(self, candidate: str) -> None:
        leader = self.leader()
        assert leader is not None and leader != candidate
        code, body = self.member(leader).rest("/switchover", {"leader": leader, "candidate": candidate}, timeout=60)
        assert code == 200, (code, body)

    def cleanup(self) -> None:
        # Every member at once, and no graceful stop: the cluster and its folders are thrown
        # away, and one member stopped after the other (each Patroni stopping its PostgreSQL
        # and leaving the cluster) took 7-14 s of a busy host for nothing.
        postmasters = [pid for pid in (member.discard() for member in self.members) if pid is not None]
        deadline = time.monotonic() + 10
        for pid in postmasters:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for member in self.members:
            failure_logs.unwatch(member)  # its tail kept before the folder goes
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)
