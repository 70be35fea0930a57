#!/bin/sh
# Run "$@" as on a machine with no PostgreSQL installed: in a private mount namespace where an
# empty read-only tmpfs covers each system install directory, so initdb, pg_ctl and postgres are
# neither on PATH (symlinks such as /usr/local/bin/initdb dangle) nor under /usr/lib/postgresql.
# Needs root (CAP_SYS_ADMIN) for unshare; mounts made inside vanish with the namespace.
set -eu
exec unshare --mount --fork sh -eu -c '
for dir in /usr/lib/postgresql /usr/local/pgsql /opt/postgresql; do
  if [ -d "$dir" ]; then mount -t tmpfs -o ro,mode=755 tmpfs "$dir"; fi
done
for name in initdb pg_ctl postgres; do
  if found=$(command -v "$name"); then
    echo "without_system_postgres: $name is still visible at $found" >&2
    exit 97
  fi
done
exec "$@"' without_system_postgres "$@"
