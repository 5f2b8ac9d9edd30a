"""The heartbeat's writer on real servers: off unless configured (nothing written, no
session); the WAL it writes a day, measured; a table that is not there is said once and
costs nothing else; what it must survive (hostile input, round three): a sequence past a
bigint, outages, a reload that turns it on, `lagwatch check`, a schema named as the login,
a table with code on it or a stranger's. No timing is judged here (how closely the
replicas' readings follow the beats is: test_heartbeat.py).

What it does not depend on is the server's version: its SQL is the same on every one.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from chaoscluster import ChaosCluster
from harness import Lagwatch, run_cli
from loads import create_heartbeat_table, heartbeat_config, heartbeat_sessions

pytestmark = pytest.mark.one_pg_version


@pytest.fixture(scope="module")
def beating(pg_cluster: ChaosCluster) -> ChaosCluster:
    create_heartbeat_table(pg_cluster)
    return pg_cluster


def test_off_unless_configured(beating: ChaosCluster, tmp_path: Path) -> None:
    rows = beating.primary.scalar("SELECT count(*) FROM lagwatch_heartbeat")
    with Lagwatch(tmp_path, heartbeat_config(beating, interval="100ms")) as lw:
        lw.wait_ready()
        lw.wait_cycles(10)
        assert heartbeat_sessions(beating) == 0
        assert beating.primary.scalar("SELECT count(*) FROM lagwatch_heartbeat") == rows


# The WAL the heartbeat's own transactions wrote between two positions: every record of a
# transaction that touched the heartbeat table's file (its UPDATE, an index entry, its
# commit), read with pg_walinspect; nothing else that wrote meanwhile (an autovacuum of the
# tables the test before left, its full-page images after the CHECKPOINT) is counted.
_HEARTBEAT_WAL_SQL = """WITH r AS (SELECT * FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)),
beats AS (SELECT DISTINCT xid FROM r
          WHERE xid <> '0' AND block_ref LIKE '%%/' || pg_relation_filenode('lagwatch_heartbeat') || ' %%')
SELECT coalesce(sum(record_length), 0)::bigint, (SELECT count(*) FROM beats)
FROM r WHERE xid IN (SELECT xid FROM beats)"""


def test_the_wal_it_writes_a_day(beating: ChaosCluster, tmp_path: Path) -> None:
    """The WAL a beat writes, over 200 of them, extrapolated to a day at the default 25 ms
    (40 a second): printed (docs/lag.md quotes it) and under 1 GB. Counted in beats, and in
    the records of the beats' own transactions: a rate over the clock, or all the WAL the
    primary wrote meanwhile, failed once beside a CPU-bound process (other writers' WAL in
    the span, or fewer beats a second on a starved host: neither is the heartbeat's cost)."""
    config = heartbeat_config(beating, heartbeat={"id": "wal-a-day"})
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        lw.wait_for("beating", lambda: (lw.value("lagwatch_heartbeat_beats_total") or 0) > 20, timeout=10)
        before = str(beating.primary.scalar("SELECT pg_current_wal_lsn()"))
        beats_before = lw.value("lagwatch_heartbeat_beats_total") or 0
        lw.wait_for("200 beats", lambda: (lw.value("lagwatch_heartbeat_beats_total") or 0) >= beats_before + 200,
                    timeout=60)
        after = str(beating.primary.scalar("SELECT pg_current_wal_lsn()"))
    (written, transactions), = beating.primary.execute(_HEARTBEAT_WAL_SQL, (before, after))
    # Each beat its own transaction. The beats counter is as of lagwatch's last published
    # cycle, so the span read may hold a cycle's worth (40) fewer than it says.
    assert transactions >= 100, transactions
    per_beat = written / transactions
    per_day = per_beat * 40 * 86400
    print(f"heartbeat: {transactions} beats wrote {written} bytes of WAL, {per_beat:.0f} bytes a beat: "
          f"{per_day / 1e9:.2f} GB a day at 25 ms")
    assert per_day < 1e9


def test_a_missing_table_is_said_once_and_costs_nothing_else(beating: ChaosCluster, tmp_path: Path) -> None:
    config = heartbeat_config(beating, interval="100ms", heartbeat={"table": "lagwatch_no_such_table", "id": "x"})
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        lw.wait_cycles(20)
        text = lw.log_text()
        assert text.count("cannot write the heartbeat") == 1, text[-3000:]
        assert "deploy/sql/lagwatch-heartbeat.sql" in text
        assert lw.value("lagwatch_up", node="replica1") == 1 and lw.value("lagwatch_up", node="primary") == 1
        assert lw.value("lagwatch_replica_lag_seconds", replica="replica1") is not None


# -- what the heartbeat must survive (hostile input, round three) ---------------------------


def _with_heartbeat(config: dict[str, Any], heartbeat: dict[str, Any]) -> dict[str, Any]:
    """``config`` (its listen address kept) with its cluster's heartbeat set so."""
    return {**config, "clusters": [{**config["clusters"][0], "heartbeat": heartbeat}]}


def _reloaded(lw: Lagwatch, config: dict[str, Any]) -> None:
    """``config`` written over the running daemon's and SIGHUP, until its reload is logged."""
    before = lw.log_text().count("lagwatch.reload: reload")
    lw.write_config(config)
    lw.signal(signal.SIGHUP)
    lw.wait_for("the reload logged", lambda: lw.log_text().count("lagwatch.reload: reload") > before, timeout=15)


@pytest.mark.parametrize("column", ["numeric", "bigint"])
def test_a_sequence_past_what_a_bigint_holds_is_said_and_nothing_else_breaks(beating: ChaosCluster, tmp_path: Path,
                                                                           column: str) -> None:
    """A table whose seq column is numeric, its row at bigint's end (or a bigint column at
    its end): the writer says once what is wrong and how to mend it, counts each attempt,
    and a reload and the shutdown stay clean. (Before: an OverflowError ended the writer
    with no line and flat counters, a SIGHUP then logged a traceback as "reload failed"
    while lagwatch_config_last_reload_successful stayed 1, and the shutdown printed one.)"""
    table = f"lagwatch_heartbeat_{column}"
    beating.primary.execute(f"DROP TABLE IF EXISTS {table}")
    beating.primary.execute(f"CREATE TABLE {table} (id text PRIMARY KEY, seq {column} NOT NULL)")
    beating.primary.execute(f"INSERT INTO {table} VALUES ('end', 9223372036854775807)")
    config = heartbeat_config(beating, interval="100ms", heartbeat={"table": table, "id": "end", "interval": "10ms"})
    lw = Lagwatch(tmp_path, config)
    try:
        lw.wait_ready()
        lw.wait_for("two failed attempts counted", lambda: (lw.value("lagwatch_heartbeat_errors_total") or 0) >= 2,
                    timeout=15)
        assert lw.value("lagwatch_heartbeat_beats_total") == 0
        text = lw.log_text()
        said = [line for line in text.splitlines() if "cannot write the heartbeat" in line]
        expected = "its seq column is numeric, not bigint" if column == "numeric" else "would not fit a bigint"
        assert len(said) == 1 and expected in said[0], said
        # A reload that replaces the writer: the old one is closed, as after its failure.
        _reloaded(lw, _with_heartbeat(config, {"table": table, "id": "end", "interval": "20ms"}))
        assert lw.daemon_value("lagwatch_config_last_reload_successful") == 1
        assert "reload failed" not in lw.log_text()
        assert lw.stop() == 0
        assert "Traceback" not in lw.log_text(), lw.log_text()[-3000:]
    finally:
        lw.stop()
        beating.primary.execute(f"DROP TABLE IF EXISTS {table}")


def test_each_outage_is_said_and_so_is_its_end(beating: ChaosCluster, tmp_path: Path) -> None:
    """The table goes away and comes back, twice: a WARNING when each outage begins and an
    INFO line when beats are written again (before, only the first outage was ever said)."""
    config = heartbeat_config(beating, interval="100ms", heartbeat={"id": "outages", "interval": "10ms"})
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        for outage in (1, 2):
            written = lw.value("lagwatch_heartbeat_beats_total") or 0
            lw.wait_for("beating", lambda w=written: (lw.value("lagwatch_heartbeat_beats_total") or 0) > w + 5,
                        timeout=15)
            beating.primary.execute("ALTER TABLE lagwatch_heartbeat RENAME TO lagwatch_heartbeat_away")
            try:
                lw.wait_for(f"outage {outage} said", lambda o=outage: lw.log_text().count(
                    "cannot write the heartbeat") == o, timeout=15)
            finally:
                beating.primary.execute("ALTER TABLE lagwatch_heartbeat_away RENAME TO lagwatch_heartbeat")
            lw.wait_for(f"the end of outage {outage} said", lambda o=outage: lw.log_text().count(
                "the heartbeat is written again") == o, timeout=45)
        assert "Traceback" not in lw.log_text()


def test_a_heartbeat_turned_on_by_a_reload_is_read_by_the_replicas(beating: ChaosCluster, tmp_path: Path) -> None:
    """Off at the start, on after a SIGHUP: the replicas' polls read the heartbeat row from
    then on (before, only after a restart: the pollers kept were made without it)."""
    config = heartbeat_config(beating, interval="100ms")
    with Lagwatch(tmp_path, config) as lw:
        lw.wait_ready()
        assert lw.value("lagwatch_view_up", node="replica1", view="heartbeat") is None
        _reloaded(lw, _with_heartbeat(config, {"id": "reloaded", "interval": "10ms"}))
        for replica in ("replica1", "replica2"):
            lw.wait_for(f"{replica} reads the heartbeat", lambda r=replica: lw.value(
                "lagwatch_view_up", node=r, view="heartbeat") == 1, timeout=15)
        # The writer beats on its own schedule from its own session: its first beat may come
        # a cycle after the replicas read the row (CI saw 0 at the reading's cycle).
        lw.wait_for("a beat written", lambda: (lw.value("lagwatch_heartbeat_beats_total") or 0) > 0, timeout=15)


def test_a_check_writes_no_heartbeat(beating: ChaosCluster, tmp_path: Path) -> None:
    """``lagwatch check`` on a config with a heartbeat: it measures, and never writes into
    the row a running daemon beats in (before, six beats went into it)."""
    config = heartbeat_config(beating, heartbeat={"id": "daemon-row"})
    path = tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    before = beating.primary.scalar("SELECT seq FROM lagwatch_heartbeat WHERE id = 'daemon-row'")
    done = run_cli("check", "-c", str(path))
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert beating.primary.scalar("SELECT seq FROM lagwatch_heartbeat WHERE id = 'daemon-row'") == before
    assert heartbeat_sessions(beating) == 0


def test_a_schema_named_as_the_login_runs_nothing_of_the_attackers(beating: ChaosCluster, tmp_path: Path) -> None:
    """A role with CREATE on the database makes the schema the login's ``$user`` would
    search first (here ``postgres``, the tests' login), with a heartbeat table whose trigger
    and functions named as pg_walinspect's record every call: lagwatch's sessions search
    pg_catalog, public and pg_temp only, so none of it runs (before, the beats went into the
    attacker's table and its wrapper of pg_get_wal_stats ran as lagwatch)."""
    primary = beating.primary
    fn_args = {name: str(primary.scalar("SELECT pg_get_function_arguments(%s::regprocedure)", (signature,)))
               for name, signature in (("pg_get_wal_stats", "public.pg_get_wal_stats(pg_lsn,pg_lsn,boolean)"),
                                       ("pg_get_wal_records_info", "public.pg_get_wal_records_info(pg_lsn,pg_lsn)"))}
    primary.execute("DROP SCHEMA IF EXISTS postgres CASCADE")
    primary.execute("CREATE SCHEMA postgres")
    try:
        primary.execute("CREATE TABLE postgres.stolen (what text, at timestamptz DEFAULT now())")
        primary.execute("CREATE TABLE postgres.lagwatch_heartbeat (id text PRIMARY KEY, seq bigint NOT NULL)")
        primary.execute("CREATE FUNCTION postgres.steal() RETURNS trigger LANGUAGE plpgsql AS "
                        "$$ BEGIN INSERT INTO postgres.stolen (what) VALUES ('heartbeat'); RETURN NEW; END $$")
        primary.execute("CREATE TRIGGER steal BEFORE INSERT OR UPDATE ON postgres.lagwatch_heartbeat "
                        "FOR EACH ROW EXECUTE FUNCTION postgres.steal()")
        for name, args in fn_args.items():
            # The same arguments, the IN ones renamed (pg_get_wal_records_info's OUT columns
            # reuse their names, which PL/pgSQL refuses).
            ins = [a for a in args.split(", ") if not a.startswith("OUT ")]
            renamed = [f"i{n} {a.split(' ', 1)[1]}" for n, a in enumerate(ins)]
            outs = [a for a in args.split(", ") if a.startswith("OUT ")]
            call = ", ".join(f"i{n}" for n in range(len(ins)))
            primary.execute(f"CREATE FUNCTION postgres.{name}({', '.join(renamed + outs)}) RETURNS SETOF record "
                            f"LANGUAGE plpgsql AS $$ BEGIN INSERT INTO postgres.stolen (what) VALUES ('{name}'); "
                            f"RETURN QUERY SELECT * FROM public.{name}({call}); END $$")
        beating.wait_replayed()
        config = heartbeat_config(beating, interval="100ms", heartbeat={"id": "hostile-schema", "interval": "10ms"})
        with Lagwatch(tmp_path, config) as lw:
            lw.wait_ready()
            lw.wait_for("beating", lambda: (lw.value("lagwatch_heartbeat_beats_total") or 0) > 20, timeout=15)
            # pg_walinspect called, by its unqualified names: the WAL dating's reads and the
            # FPI statistics', cycle after cycle (the attacker's functions would have run).
            lw.wait_for("WAL reads", lambda: (lw.value("lagwatch_wal_dating_reads_total") or 0) > 10
                        and (lw.value("lagwatch_wal_inspected_bytes_total") or 0) > 0, timeout=30)
            assert (lw.value("lagwatch_wal_dating_reads_failed_total") or 0) == 0
        stolen = primary.execute("SELECT what, count(*) FROM postgres.stolen GROUP BY 1")
        assert stolen == [], stolen
        assert primary.scalar("SELECT seq FROM public.lagwatch_heartbeat WHERE id = 'hostile-schema'") > 20
    finally:
        primary.execute("DROP SCHEMA IF EXISTS postgres CASCADE")


def test_the_shipped_sql_makes_a_table_in_a_schema_of_its_own(beating: ChaosCluster, tmp_path: Path) -> None:
    """``psql -v schema=beat -f deploy/sql/lagwatch-heartbeat.sql``, ``table:
    beat.lagwatch_heartbeat``: the beats go there and the replicas read them back."""
    create_heartbeat_table(beating, schema="beat")
    try:
        config = heartbeat_config(beating, interval="100ms", heartbeat={
            "id": "own-schema", "interval": "10ms", "table": "beat.lagwatch_heartbeat"})
        with Lagwatch(tmp_path, config) as lw:
            lw.wait_ready()
            lw.wait_for("beating", lambda: (lw.value("lagwatch_heartbeat_beats_total") or 0) > 20, timeout=15)
            lw.wait_for("replica1 reads the heartbeat", lambda: lw.value(
                "lagwatch_view_up", node="replica1", view="heartbeat") == 1, timeout=15)
            assert (lw.value("lagwatch_heartbeat_errors_total") or 0) == 0
        assert beating.primary.scalar("SELECT seq FROM beat.lagwatch_heartbeat WHERE id = 'own-schema'") > 20
    finally:
        beating.primary.execute("DROP SCHEMA IF EXISTS beat CASCADE")


@pytest.mark.parametrize(("plant", "said"), [
    ("CREATE TRIGGER steal BEFORE INSERT OR UPDATE ON planted.lagwatch_heartbeat "
     "FOR EACH ROW EXECUTE FUNCTION planted.steal()", "triggers: steal"),
    ("ALTER TABLE planted.lagwatch_heartbeat OWNER TO mallory", "it is owned by mallory, who may put code on it"),
    ("ALTER SCHEMA planted OWNER TO mallory", "its schema planted is owned by mallory, who may replace it"),
])
def test_a_table_with_code_on_it_or_a_strangers_is_never_written(beating: ChaosCluster, tmp_path: Path,
                                                                plant: str, said: str) -> None:
    """A heartbeat table with a trigger (whose function would run as lagwatch's role and
    read what that role reads), or a table or schema a stranger owns (who could add one
    later): lagwatch says what it found, once, and writes nothing (before, it beat into
    any table the name resolved to). The trigger's function records each call."""
    primary = beating.primary
    primary.execute("DROP SCHEMA IF EXISTS planted CASCADE")
    primary.execute("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'mallory') "
                    "THEN CREATE ROLE mallory NOLOGIN; END IF; END $$")
    primary.execute("CREATE SCHEMA planted")
    try:
        primary.execute("CREATE TABLE planted.stolen (what text)")
        primary.execute("CREATE TABLE planted.lagwatch_heartbeat (id text PRIMARY KEY, seq bigint NOT NULL)")
        primary.execute("CREATE FUNCTION planted.steal() RETURNS trigger LANGUAGE plpgsql AS "
                        "$$ BEGIN INSERT INTO planted.stolen VALUES ('beat'); RETURN NEW; END $$")
        primary.execute(plant)
        config = heartbeat_config(beating, interval="100ms", heartbeat={
            "id": "planted", "interval": "10ms", "table": "planted.lagwatch_heartbeat"})
        with Lagwatch(tmp_path, config) as lw:
            lw.wait_ready()
            lw.wait_for("two failed attempts counted",
                        lambda: (lw.value("lagwatch_heartbeat_errors_total") or 0) >= 2, timeout=15)
            assert lw.value("lagwatch_heartbeat_beats_total") == 0
            lines = [line for line in lw.log_text().splitlines() if "cannot write the heartbeat" in line]
            assert len(lines) == 1 and said in lines[0] and "planted.lagwatch_heartbeat" in lines[0], lines
        assert primary.scalar("SELECT count(*) FROM planted.lagwatch_heartbeat") == 0
        assert primary.scalar("SELECT count(*) FROM planted.stolen") == 0
    finally:
        primary.execute("DROP SCHEMA IF EXISTS planted CASCADE")
