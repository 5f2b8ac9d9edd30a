"""The tests' PgBouncer: lagwatch.demo.pool's (Debian's 1.18), with a read-write database
beside the include file lagwatch owns, in a folder of its own under /tmp (pytest's tmp
folders are private to root, and PgBouncer runs unprivileged), removed by ``cleanup``."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Self

from lagwatch.demo.pool import PgBouncer


class PgBouncerServer(PgBouncer):
    def __init__(self, *, primary_dsn_entry: str, include_name: str = "lagwatch-replicas.ini",
                 pool_mode: str = "transaction") -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="lagwatch-pgbouncer-"))
        super().__init__(self.workdir, self.workdir / include_name, [f"app_rw = {primary_dsn_entry}"],
                         pool_mode=pool_mode)

    def start(self, timeout: float = 15) -> None:
        if not self.include_file.exists():
            self.include_file.write_text("")  # the tests that write no read pool have none
        super().start(timeout)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.cleanup()  # __exit__ will not run: remove the folder (and any process) now
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def readable_by_servers(path: Path) -> None:
    """Let the unprivileged PgBouncer read a file lagwatch (root) writes."""
    os.chmod(path, 0o644)


def read_pool_for(cluster: Any) -> PgBouncerServer:
    """A PgBouncer (not started) in front of ``cluster`` as an operator would set it up
    before lagwatch runs: app_rw on the primary, app_ro on both replicas, in the include
    file lagwatch owns."""
    server = PgBouncerServer(primary_dsn_entry=f"host=127.0.0.1 port={cluster.primary.port} dbname=postgres")
    r1, r2 = cluster.replicas
    server.include_file.write_text(f"app_ro = host={r1.host},{r2.host} port={r1.port} dbname=postgres\n")
    readable_by_servers(server.include_file)
    return server
