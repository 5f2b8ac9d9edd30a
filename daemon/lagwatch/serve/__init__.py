"""The serve stage: what lagwatch says, from the last published snapshot only.

In: the FleetSnapshot a cycle published. Out: /metrics (exposition), /status (HTML),
/api/status (JSON), /healthz, /readyz over lagwatch's own HTTP server (TLS and basic auth from
config/web.py), the cycle's log line, and systemd's status line. Nothing here queries
PostgreSQL.
"""
