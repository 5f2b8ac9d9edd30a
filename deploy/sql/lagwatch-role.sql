-- The role lagwatch connects as: a monitoring role with what it reads and nothing more.
-- Run as a superuser on the primary (it replicates to the replicas):
--   psql -v password="'...'" -f deploy/sql/lagwatch-role.sql
-- Without -v password, the role has no password (use peer/cert auth or set one later).
-- Check it from lagwatch's side: lagwatch check --grants -c /etc/lagwatch/lagwatch.yaml

CREATE ROLE lagwatch WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION CONNECTION LIMIT 10;
\if :{?password}
ALTER ROLE lagwatch PASSWORD :password;
\endif

-- Every cycle: pg_stat_replication's LSN and lag columns (on the primary) and
-- pg_stat_wal_receiver's status (on a replica) are shown only to pg_read_all_stats.
GRANT pg_read_all_stats TO lagwatch;
-- The WAL directory's size (lagwatch_wal_directory_bytes).
GRANT EXECUTE ON FUNCTION pg_ls_waldir() TO lagwatch;
-- Everything else lagwatch reads is open to every role: pg_last_wal_replay_lsn(),
-- pg_get_wal_replay_pause_state(), pg_replication_slots, pg_stat_wal, pg_stat_database,
-- pg_locks and pg_try_advisory_lock() (pool control's leader election).
--
-- Not pg_monitor: its pg_read_all_settings shows each replica's primary_conninfo, password
-- included, which lagwatch never needs.

-- Optional: FPI byte statistics from pg_walinspect (PostgreSQL 15+). Only if you want them:
--   CREATE EXTENSION IF NOT EXISTS pg_walinspect;
--   GRANT EXECUTE ON FUNCTION pg_get_wal_stats(pg_lsn, pg_lsn, boolean) TO lagwatch;
-- and what wal_compression saves on full-page images (PostgreSQL 16+):
--   GRANT EXECUTE ON FUNCTION pg_get_wal_block_info(pg_lsn, pg_lsn, boolean) TO lagwatch;
-- and each replica's staleness dated from the commit times in the WAL just past its replay
-- position, to the millisecond under any load (lag_from_wal; docs/lag.md):
--   GRANT EXECUTE ON FUNCTION pg_get_wal_records_info(pg_lsn, pg_lsn) TO lagwatch;
-- (with pg_get_wal_stats granted too, those reads count the WAL before they describe it,
-- and reach six times as far past a replica for the same cost on the primary).
-- Without it lagwatch says once in its log that it skips the FPI statistics, and why.
