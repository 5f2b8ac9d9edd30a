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
-- WAL archiving's segments waiting to be archived (lagwatch_archive_waiting_segments), where
-- archive_mode is on: the .ready files in pg_wal/archive_status.
GRANT EXECUTE ON FUNCTION pg_ls_archive_statusdir() TO lagwatch;
-- Everything else lagwatch reads is open to every role: pg_last_wal_replay_lsn(),
-- pg_get_wal_replay_pause_state(), pg_replication_slots, pg_stat_wal, pg_stat_database,
-- pg_locks and pg_try_advisory_lock() (pool control's leader election).
--
-- Not pg_monitor: its pg_read_all_settings shows each replica's primary_conninfo, password
-- included, which lagwatch never needs.

-- Each replica's staleness dated from the commit times in the WAL just past its replay
-- position, to the millisecond under any load (lag_from_wal; docs/lag.md), and the FPI
-- share of the WAL: pg_walinspect (PostgreSQL 15+), in the database lagwatch connects to
-- (run this file connected to it: psql -d DBNAME). Without it the replicas are dated by
-- the LSN clock and commit timestamps, which read low under load (docs/lag.md).
--   pg_get_wal_records_info: one row per WAL record with its description. What that shows
--     this role: commit times and transaction IDs, relation and block numbers, the locks a
--     standby must take, and a logical message's payload in hex
--     (pg_logical_emit_message(): whatever an application or a CDC tool put in it); no
--     row data. It decodes the WAL from disk: lagwatch reads at most
--     lag_from_wal_max_bytes (16 MB) a cycle, planned to 7.5 % of the interval, cancelled
--     by the server at a quarter of it.
--   pg_get_wal_stats: counts and sizes per kind of record, nothing of their content; with
--     it, those reads count the WAL before they describe it and reach six times as far for
--     the same cost; lagwatch also reads the FPI statistics with it, every 10 s.
SELECT current_setting('server_version_num')::int >= 150000 AS lagwatch_walinspect \gset
\if :lagwatch_walinspect
CREATE EXTENSION IF NOT EXISTS pg_walinspect;
GRANT EXECUTE ON FUNCTION pg_get_wal_records_info(pg_lsn, pg_lsn) TO lagwatch;
GRANT EXECUTE ON FUNCTION pg_get_wal_stats(pg_lsn, pg_lsn, boolean) TO lagwatch;
\endif

-- Optional, not granted here: what wal_compression saves on full-page images
-- (PostgreSQL 16+). pg_get_wal_block_info returns each block's raw data, full-page images
-- included: the rows themselves, any table's. Only if you want that figure:
--   GRANT EXECUTE ON FUNCTION pg_get_wal_block_info(pg_lsn, pg_lsn, boolean) TO lagwatch;
-- Without it lagwatch says once in its log that it skips the compression savings, and why.
