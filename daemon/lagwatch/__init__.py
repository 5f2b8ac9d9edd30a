"""lagwatch: truthful PostgreSQL replica lag.

The folders are the pipeline of one cycle, each stage importing only the ones below it
(setup.cfg's import-linter contract keeps it so):

    sources/   where the clusters come from: the config file, its clusters_dir, Patroni
    read/      the I/O of a cycle with PostgreSQL: sessions, the poll of one node, WAL reads
    estimate/  what the readings mean, no I/O, the clock passed in: dating, windows, rates,
               roles, diagnosis; the tracker folds them into an immutable snapshot
    act/       what lagwatch does about a snapshot: policy (pure), leadership, holds, pool
               control (through poolers/)
    serve/     what it says: HTTP, the exposition, /status, /api/status, systemd's status

Below them: config/ (the frozen config), rooms/ (each thing read from PostgreSQL beside the
lag core, with its families, status part and page line), views/ (the lag core's views: their
SQL and parsers; what they make is the estimate stage's), render/ (the families' catalogue
and the text they are written in). On top: daemon.py and runtime.py (the composition of one
cycle), reload.py, runner.py, cli.py, check.py, grants.py. demo/ is a room of its own that
nothing the daemon runs imports.
"""

__version__ = "0.1.0"
