#!/usr/bin/env bash
# Builds dist/lagwatch_VERSION_ARCH.deb from this checkout (docs/install-debian.md).
#
#   bash deploy/debian/build.sh            # VERSION: lagwatch.__version__
#   LAGWATCH_DEB_VERSION=0.1.0-2 LAGWATCH_DEB_OUT=/tmp/out bash deploy/debian/build.sh
#   LAGWATCH_DEB_WHEEL=dist/lagwatch-0.1.0-py3-none-any.whl bash deploy/debian/build.sh
#
# What it needs is what tests/setup-machine.sh installs: Debian's python3 with venv and its
# headers, libpq-dev and gcc (psycopg's C implementation is compiled against Debian's
# libpq), dpkg-deb; the Python packages come from PyPI, every version pinned by
# deploy/debian/requirements.txt. The package holds a venv at /usr/lib/lagwatch made by
# Debian's python3 (Depends: the python3 it was built with, and what dpkg-shlibdeps finds
# the compiled extensions link, libpq5 among them), /usr/bin/lagwatch (a shell script),
# the units (their ExecStart the package's /usr/bin/lagwatch: deploy/systemd's say the
# venv path of docs/install-debian.md's other distributions), /etc/lagwatch's conffiles,
# the share dir (/usr/share/lagwatch), a man page and README.Debian. Hand-written rather
# than debhelper + dh-virtualenv (not in Debian 12): the few steps are each said here.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/deploy/debian"
PY=/usr/bin/python3
PREFIX=/usr/lib/lagwatch
VERSION=${LAGWATCH_DEB_VERSION:-$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/daemon/lagwatch/__init__.py")}
ARCH=$(dpkg --print-architecture)
PYVERSION=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')
OUTDIR=${LAGWATCH_DEB_OUT:-$ROOT/dist}
OUT="$OUTDIR/lagwatch_${VERSION}_${ARCH}.deb"

WORK=$(mktemp -d /tmp/lagwatch-deb-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
STAGE="$WORK/root"
started=$(date +%s)

# 1. The venv, made where it will live inside the staging tree; its paths are the staging
#    tree's until step 3 rewrites them.
$PY -m venv "$STAGE$PREFIX"
VPY="$STAGE$PREFIX/bin/python3"
"$VPY" -m pip install -q --disable-pip-version-check --no-compile --no-deps -r "$HERE/requirements.txt"
# lagwatch's own wheel: built from the checkout, or the one LAGWATCH_DEB_WHEEL names (the
# wheel a release, or the test suite, has already built from this tree's sdist).
if [ -n "${LAGWATCH_DEB_WHEEL:-}" ]; then
  WHEEL=$LAGWATCH_DEB_WHEEL
else
  "$VPY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$WORK/wheel" "$ROOT"
  WHEEL=$(echo "$WORK"/wheel/lagwatch-*.whl)
fi
"$VPY" -m pip install -q --disable-pip-version-check --no-compile --no-deps "$WHEEL"
"$VPY" -m pip uninstall -q -y pip setuptools 2>/dev/null || true
"$VPY" -c 'import psycopg; assert psycopg.pq.__impl__ == "c", psycopg.pq.__impl__'

# 2. What Debian does not want in a package: byte-code (postinst compiles it), pip's
#    records of where it was installed, the venv's activate scripts (they name the tree),
#    its console scripts (their #! names the venv's python, which lintian rightly refuses:
#    /usr/bin/lagwatch is a shell script that runs it), and PyYAML's C extension, which
#    embeds its own libyaml (lintian: embedded-library; lagwatch reads YAML with the pure
#    Python loader, which PyYAML falls back to: a config file is small).
find "$STAGE$PREFIX" -name __pycache__ -type d -prune -exec rm -rf {} +
find "$STAGE$PREFIX" -name '*.pyc' -delete
rm -f "$STAGE$PREFIX"/bin/activate* "$STAGE$PREFIX"/bin/Activate.ps1
for script in "$STAGE$PREFIX"/bin/*; do
  if [ -f "$script" ] && [ ! -L "$script" ]; then rm -f "$script"; fi
done
rm -f "$STAGE$PREFIX"/lib/python*/site-packages/yaml/_yaml*.so
"$VPY" -c 'import yaml; assert not yaml.__with_libyaml__'
# The venv's python: a relative link to Debian's (lintian: absolute-symlink-in-top-level-folder).
ln -sfn ../../../bin/python3 "$STAGE$PREFIX/bin/python3"
find "$STAGE$PREFIX" -path '*.dist-info/RECORD' -delete
find "$STAGE$PREFIX" -path '*.dist-info/direct_url.json' -delete

# 3. The staging tree's path out of pyvenv.cfg (the one file that names it now).
sed -i "s|$STAGE||g" "$STAGE$PREFIX/pyvenv.cfg"
if grep -rlF "$STAGE" "$STAGE$PREFIX" >/dev/null 2>&1; then
  echo "build.sh: the staging path is still named in:" >&2
  grep -rlF "$STAGE" "$STAGE$PREFIX" >&2
  exit 1
fi
# Strip the compiled extensions' debugging symbols (lintian: unstripped-binary-or-object).
find "$STAGE$PREFIX" -name '*.so*' -type f -exec strip --strip-unneeded --remove-section=.comment \
  --remove-section=.note {} +

# 4. The rest of the tree.
install -d "$STAGE/usr/bin" "$STAGE/lib/systemd/system" "$STAGE/etc/lagwatch" \
  "$STAGE/usr/share/doc/lagwatch" "$STAGE/usr/share/man/man1" "$STAGE/usr/share/lintian/overrides"
printf '#!/bin/sh\n# lagwatch, in its own Python environment (/usr/lib/lagwatch).\nexec /usr/lib/lagwatch/bin/python3 -m lagwatch.cli "$@"\n' \
  > "$STAGE/usr/bin/lagwatch"
chmod 0755 "$STAGE/usr/bin/lagwatch"
ln -s ../lib/lagwatch/share/lagwatch "$STAGE/usr/share/lagwatch"
for unit in lagwatch.service lagwatch@.service; do
  sed -e 's|^ExecStart=/opt/lagwatch/bin/lagwatch |ExecStart=/usr/bin/lagwatch |' \
      -e 's|^# lagwatch installed in its own venv.*$|# The Debian package: /usr/bin/lagwatch runs the venv in /usr/lib/lagwatch|' \
      "$ROOT/deploy/systemd/$unit" > "$STAGE/lib/systemd/system/$unit"
  grep -q '^ExecStart=/usr/bin/lagwatch ' "$STAGE/lib/systemd/system/$unit"
done
install -m 0644 "$ROOT/deploy/lagwatch.example.yaml" "$STAGE/etc/lagwatch/lagwatch.yaml"
install -m 0600 "$HERE/lagwatch.env" "$STAGE/etc/lagwatch/lagwatch.env"
install -m 0644 "$HERE/README.Debian" "$HERE/copyright" "$STAGE/usr/share/doc/lagwatch/"
sed "s/@VERSION@/$VERSION/" "$HERE/changelog" | gzip -9n > "$STAGE/usr/share/doc/lagwatch/changelog.Debian.gz"
gzip -9n < "$HERE/lagwatch.1" > "$STAGE/usr/share/man/man1/lagwatch.1.gz"
install -m 0644 "$HERE/lintian-overrides" "$STAGE/usr/share/lintian/overrides/lagwatch"

# 5. DEBIAN/: control, conffiles, maintainer scripts.
install -d "$STAGE/DEBIAN"
printf '/etc/lagwatch/lagwatch.yaml\n/etc/lagwatch/lagwatch.env\n' > "$STAGE/DEBIAN/conffiles"
for script in postinst prerm postrm; do install -m 0755 "$HERE/$script" "$STAGE/DEBIAN/$script"; done
SIZE=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
# The shared libraries the compiled extensions link (libc, libpq5 for psycopg's C
# implementation...), as Debian's own packages compute them: dpkg-shlibdeps, which wants a
# source package's debian/control to stand in.
mkdir -p "$WORK/src/debian"
printf 'Source: lagwatch\n\nPackage: lagwatch\nArchitecture: any\n' > "$WORK/src/debian/control"
mapfile -t objects < <(find "$STAGE$PREFIX" -name '*.so*' -type f)
SHLIBS=$(cd "$WORK/src" && dpkg-shlibdeps -O --ignore-missing-info "${objects[@]}" | sed -n 's/^shlibs:Depends=//p')
sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$ARCH/" -e "s/@SIZE@/$SIZE/" \
    -e "s/@PYTHON@/python$PYVERSION/" -e "s/@PYNEXT@/${PYVERSION%.*}.$(( ${PYVERSION#*.} + 1 ))/" \
    -e "s/@PYVERSION@/$PYVERSION/" -e "s/@SHLIBS@/$SHLIBS/" "$HERE/control" > "$STAGE/DEBIAN/control"

mkdir -p "$OUTDIR"
find "$STAGE" -exec touch -h -d "@${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || date +%s)}" {} +
dpkg-deb --root-owner-group -Zxz --build "$STAGE" "$OUT" >/dev/null
echo "built $OUT ($(du -h "$OUT" | cut -f1), installed ${SIZE} kB) in $(( $(date +%s) - started )) s"
