-- The optional heartbeat (clusters[].heartbeat in lagwatch's config): lagwatch's only write.
-- Run once on the primary, in the database lagwatch's DSN names, as a role that may create
-- tables. Only if you turn the heartbeat on: lagwatch never creates the table itself.
--
-- One row per lagwatch instance (its heartbeat.id, the host's name by default), raised
-- every heartbeat.interval on lagwatch's own session with synchronous_commit = local. At
-- the default 25 ms that is 40 small commits a second: about 0.55 GB of WAL a day (~160
-- bytes a beat, measured in tests/integration/test_heartbeat.py, said in docs/lag.md),
-- shipped to and replayed on every replica.
CREATE TABLE IF NOT EXISTS lagwatch_heartbeat (
    id  text PRIMARY KEY,
    seq bigint NOT NULL
) WITH (fillfactor = 50);  -- room for HOT updates: the row never leaves its page

GRANT SELECT, INSERT, UPDATE ON lagwatch_heartbeat TO lagwatch;
