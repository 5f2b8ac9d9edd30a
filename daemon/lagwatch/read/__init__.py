"""The read stage of a cycle: lagwatch's I/O with PostgreSQL.

In: a cluster's nodes (config) and the views and rooms to read. Out: one NodeObservation per
node per cycle (estimate/snapshot.py), each reading stamped with the instant it was true on
lagwatch's monotonic clock. Sessions keep one connection per node; the poll is one round trip
where it can be; the primary's WAL reads (commit times, pg_walinspect) follow its answer;
the heartbeat is lagwatch's one write.
"""
