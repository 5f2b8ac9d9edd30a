-- The optional heartbeat (clusters[].heartbeat in lagwatch's config): lagwatch's only write.
-- Run once on the primary, in the database lagwatch's DSN names, as the role that is to own
-- the table (a superuser or the database's owner: lagwatch refuses a table owned by anyone
-- else, since code its owner puts on it would run as lagwatch), after lagwatch-role.sql.
-- Only if you turn the heartbeat on: lagwatch never creates the table itself.
--   psql -d DBNAME -v schema=lagwatch -f deploy/sql/lagwatch-heartbeat.sql
-- makes lagwatch.lagwatch_heartbeat (heartbeat.table: lagwatch.lagwatch_heartbeat); without
-- -v schema the table goes in public, where heartbeat.table's default looks for it.
-- A schema of its own is what we advise: then the login's "$user" schema (lagwatch) is
-- taken by a schema the owner holds, and nobody with CREATE on public can plant a table
-- there first (lagwatch's sessions never search "$user" anyway: the config's schemas).
--
-- One row per lagwatch instance (its heartbeat.id, the host's name by default), raised
-- every heartbeat.interval on lagwatch's own session with synchronous_commit = local. At
-- the default 25 ms that is 40 small commits a second: about 0.55 GB of WAL a day (~160
-- bytes a beat, measured in tests/integration/test_heartbeat.py, said in docs/lag.md),
-- shipped to and replayed on every replica.
--
-- Leave the table as it is made here: lagwatch checks before it beats that no trigger,
-- rule, row security, CHECK constraint, expression index or other column is on it, and
-- that its owner and its schema's owner are a superuser or the database's owner, and says
-- in its log what it found otherwise (heartbeattable.py).
\set ON_ERROR_STOP on
\if :{?schema}
\else
\set schema public
\endif
CREATE SCHEMA IF NOT EXISTS :"schema";
GRANT USAGE ON SCHEMA :"schema" TO lagwatch;
CREATE TABLE IF NOT EXISTS :"schema".lagwatch_heartbeat (
    id  text PRIMARY KEY,
    seq bigint NOT NULL
) WITH (fillfactor = 50);  -- room for HOT updates: the row never leaves its page

GRANT SELECT, INSERT, UPDATE ON :"schema".lagwatch_heartbeat TO lagwatch;
