"""PgBouncer: lagwatch owns one include file holding the read database's entry.

    app_ro = host=10.0.0.11,10.0.0.12 port=5432 dbname=app

Hosts are written in a fixed sorted order, because any change to the host string makes
PgBouncer recycle that database's server connections: an unchanged pool is never
rewritten. The file is replaced atomically, PgBouncer is told to ``RELOAD``, and the entry
is read back with ``SHOW DATABASES``: 1.18's RELOAD reports no errors, so a mismatch is the
only sign that the new entry was not taken. When the change does not take (admin console
unreachable, entry not taken), the previous file is put back: the file always says what
PgBouncer runs, and a PgBouncer restart never picks up a change lagwatch did not see take.

PgBouncer uses one port for every host of an entry, so the members of one pool must
listen on the same port. An empty ``host=`` would mean the Unix socket: with no member
left the entry points at the primary, or is left as it is (``when_empty``).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

import psycopg
import psycopg.conninfo

from lagwatch.config import POOLED_HOST, PgBouncerPoolerConfig
from lagwatch.files import write_atomically
from lagwatch.poolers.base import PRIMARY, READ_BACK_EVERY, Backend, PoolerError
from lagwatch.redact import redact_text

log = logging.getLogger("lagwatch.poolers.pgbouncer")

HEADER = "; managed by lagwatch: rewritten whenever the read pool changes, do not edit\n"
_PORT = re.compile(r"(?:^|\s)port\s*=\s*(\d+)")


def entry_hosts_and_port(members: frozenset[str], backends: Mapping[str, Backend], options: str) -> tuple[
        list[str], int | None]:
    """The sorted host list and the one port of the members; PoolerError if ports differ."""
    default_port = _PORT.search(options)
    fallback = int(default_port.group(1)) if default_port else None
    unknown = sorted(members - set(backends))
    if unknown:
        raise PoolerError(f"no host known for {', '.join(unknown)}")
    ports = {backends[m].port or fallback for m in members}
    if len(ports) > 1:
        detail = ", ".join(f"{m} on {backends[m].port or fallback}" for m in sorted(members))
        raise PoolerError(f"PgBouncer uses one port per database entry, but the pool mixes ports ({detail})")
    return sorted(backends[m].host for m in members), ports.pop() if ports else fallback


def render(database: str, members: frozenset[str], backends: Mapping[str, Backend], options: str) -> str:
    """The include file for ``members`` (pure)."""
    if not members:
        raise PoolerError("refusing to write an empty host list (it would mean the Unix socket)")
    hosts, port = entry_hosts_and_port(members, backends, options)
    unsafe = [h for h in hosts if not POOLED_HOST.fullmatch(h)]
    if unsafe:  # the config refuses these; never write one even so
        raise PoolerError(f"refusing to write host {unsafe[0]!r} into PgBouncer's config")
    rest = _PORT.sub("", options).strip()
    parts = [f"host={','.join(hosts)}"] + ([f"port={port}"] if port else []) + ([rest] if rest else [])
    return f"{HEADER}{database} = {' '.join(parts)}\n"


class AdminUnreachableError(PoolerError):
    """The admin console could not be reached: no command was sent."""


class PgBouncerPooler:
    kind = "pgbouncer"
    read_back_every = READ_BACK_EVERY

    def __init__(self, config: PgBouncerPoolerConfig, backends: Mapping[str, Backend], timeout: float = 5.0) -> None:
        self.config = config
        self.backends = backends
        self.timeout = timeout

    # -- the admin console ----------------------------------------------------------------

    def _admin(self, *commands: str) -> list[dict[str, Any]]:
        """Run admin commands on one short connection; the last one's rows are returned."""
        password = None
        if self.config.admin_password_file is not None:
            password = self.config.admin_password_file.read_text().strip()
        elif self.config.admin_password_env is not None:
            password = os.environ.get(self.config.admin_password_env)
        extra: dict[str, Any] = {"connect_timeout": max(2, round(self.timeout))}
        if password:
            extra["password"] = password
        try:
            conn = psycopg.connect(psycopg.conninfo.make_conninfo(self.config.admin_dsn, **extra), autocommit=True)
        except psycopg.Error as exc:
            message = redact_text(" ".join(str(exc).split()), [password])
            raise AdminUnreachableError(f"PgBouncer admin console: {message}") from None
        try:
            with conn:
                rows: list[dict[str, Any]] = []
                for command in commands:
                    cursor = conn.execute(command)
                    names = [d.name for d in cursor.description or []]
                    rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()] if names else []
                return rows
        except psycopg.Error as exc:
            message = redact_text(" ".join(str(exc).split()), [password])
            raise PoolerError(f"PgBouncer admin console: {message}") from None

    def _entry_hosts(self, rows: list[dict[str, Any]]) -> tuple[list[str], int | None] | None:
        row = next((r for r in rows if r.get("name") == self.config.database), None)
        if row is None:
            return None
        host = str(row.get("host") or "")
        port = row.get("port")
        return [h for h in host.split(",") if h], int(port) if port is not None else None

    def _members_of(self, hosts: list[str], port: int | None) -> frozenset[str]:
        """Map the entry's hosts back to member names: by host and the entry's port, so
        a primary and a replica on one host but different ports are told apart."""
        members = []
        for host in hosts:
            same_host = [n for n, b in self.backends.items() if b.host == host]
            exact = [n for n in same_host if port is None or self.backends[n].port in (None, port)]
            candidates = exact or same_host
            if not candidates:
                raise PoolerError(f"PgBouncer's {self.config.database} entry has a host lagwatch does not "
                                  f"know: {host}")
            # Prefer a replica when both would match (the primary only joins as a fallback).
            members.append(sorted(candidates, key=lambda n: (n == PRIMARY, n))[0])
        return frozenset(members)

    # -- the Pooler protocol --------------------------------------------------------------

    def routes_for(self, members: frozenset[str], current: frozenset[str] | None) -> frozenset[str]:
        if members:
            return members
        if self.config.when_empty == "primary":
            return frozenset({PRIMARY})
        return current if current is not None else members  # "keep": the entry stays as it is

    def read_pool(self) -> frozenset[str]:
        entry = self._entry_hosts(self._admin("SHOW DATABASES"))
        if entry is None:
            return frozenset()  # not defined yet: lagwatch will write it
        return self._members_of(*entry)

    def apply_pool(self, members: frozenset[str]) -> None:
        if not members:
            if self.config.when_empty == "keep":
                raise PoolerError("no member left for the pool; keeping PgBouncer's current entry (when_empty: keep)")
            members = frozenset({PRIMARY})
        path = self.config.include_file
        text = render(self.config.database, members, self.backends, self.config.options)
        try:
            previous = path.read_text() if path.exists() else None
        except OSError as exc:
            raise PoolerError(f"cannot read {path}: {exc.strerror}") from None
        if previous != text:
            try:
                write_atomically(path, text)
            except OSError as exc:
                raise PoolerError(f"cannot write {path}: {exc.strerror}") from None
        try:
            rows = self._admin("RELOAD", "SHOW DATABASES")
        except AdminUnreachableError:
            # RELOAD never reached PgBouncer, so it still runs the previous entry: put the
            # previous file back, so that file and PgBouncer agree until the retry.
            self._restore(previous, text)
            raise
        expected_hosts, expected_port = entry_hosts_and_port(members, self.backends, self.config.options)
        entry = self._entry_hosts(rows)
        if entry is None or entry[0] != expected_hosts or (expected_port and entry[1] != expected_port):
            self._restore(previous, text)  # keep the file in line with what PgBouncer runs
            seen = "no entry" if entry is None else f"host={','.join(entry[0])} port={entry[1]}"
            raise PoolerError(f"PgBouncer did not take the new {self.config.database} entry after RELOAD "
                              f"(SHOW DATABASES says {seen}); see PgBouncer's log")

    def _restore(self, previous: str | None, written: str) -> None:
        path = self.config.include_file
        if previous is None or previous == written:
            return
        try:
            write_atomically(path, previous)
        except OSError as exc:
            log.error("could not put the previous %s back: %s", path, exc.strerror)
