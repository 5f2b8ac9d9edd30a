"""The act stage of a cycle: what lagwatch does about a cluster's snapshot.

In: a ClusterSnapshot (estimate/), the pool's SLA (config), operator holds. Out: the read pool
a pooler (poolers/) is made to serve, only by the leader among lagwatch instances, and the
decision's reasons for serve/. The policy is a pure function with the clock passed in;
leadership (an advisory lock on the primary) and holds (a small JSON file) are the I/O.
"""
