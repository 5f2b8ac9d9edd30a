-- The role lagwatch connects as: a monitoring role, not a superuser.
-- Run as a superuser on the primary (it replicates to the replicas):
--   psql -v password="'...'" -f deploy/sql/lagwatch-role.sql
-- Without -v password, the role has no password (use peer/cert auth or set one later).

CREATE ROLE lagwatch WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION CONNECTION LIMIT 10;

-- pg_monitor gives everything lagwatch reads on every cycle:
--   pg_stat_replication with LSNs and lags (pg_read_all_stats), pg_stat_wal_receiver,
--   pg_replication_slots, pg_stat_wal, pg_ls_waldir() (WAL directory size), and the
--   replay functions (pg_last_wal_replay_lsn(), pg_get_wal_replay_pause_state()).
GRANT pg_monitor TO lagwatch;
\if :{?password}
ALTER ROLE lagwatch PASSWORD :password;
\endif

-- Pool control's leader election uses pg_try_advisory_lock(): no grant needed.

-- Optional: FPI byte statistics from pg_walinspect (PostgreSQL 15+) need the extension
-- and pg_read_server_files, which can read any file the server can. Only if you want them:
--   CREATE EXTENSION IF NOT EXISTS pg_walinspect;
--   GRANT pg_read_server_files TO lagwatch;
-- Without it lagwatch says once in its log that it skips the FPI statistics, and why.
