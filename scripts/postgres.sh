#!/usr/bin/env bash
# Starts the PostgreSQL server the tests use, and prints its URL (nothing else on stdout):
#   export AWL_TEST_POSTGRES=$(bash scripts/postgres.sh)
# Installs Debian's `postgresql` package when no server is installed, makes a cluster in
# AWL_PG_DIR (default /tmp/awl-postgres) listening on 127.0.0.1 only, port AWL_PG_PORT
# (default 55432), and starts it. Idempotent: a running cluster of its own is left as it is; a
# port held by anything else (another PostgreSQL included) is refused, never used. As root the
# server runs as the `postgres` user (PostgreSQL refuses to run as root).
# `bash scripts/postgres.sh stop` stops it.
set -euo pipefail
DIR=${AWL_PG_DIR:-/tmp/awl-postgres}
PORT=${AWL_PG_PORT:-55432}
USER_NAME=awl
PASSWORD=awl-test   # a throwaway cluster on 127.0.0.1 for tests, never a real desk
URL="postgresql://$USER_NAME:$PASSWORD@127.0.0.1:$PORT/postgres"

bindir() {
  local found
  found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  if [ -n "$found" ] && [ -x "$found/initdb" ]; then
    echo "$found"
  elif command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
    dirname "$(command -v pg_ctl)"
  fi
}

BIN=$(bindir)
if [ -z "$BIN" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "postgres.sh: no PostgreSQL server is installed; run as root, or apt-get install postgresql" >&2
    exit 1
  fi
  echo "postgres.sh: installing Debian's postgresql package" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
  BIN=$(bindir)
fi

# As root the server runs as `postgres`; otherwise as whoever runs this script.
as_server() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

if [ "${1:-}" = stop ]; then
  if [ -f "$DIR/PG_VERSION" ]; then
    as_server "$BIN/pg_ctl" -D "$DIR" -m fast stop >&2 || true
  fi
  exit 0
fi

# Answering already: nothing to do. Starting up: wait for it. Not answering: a pid file
# left by a server that was killed (its pid may belong to another process by now) is
# removed, and the server started.
ready=0
"$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 5 || ready=$?
if [ "$ready" = 1 ]; then
  for _ in $(seq 60); do
    sleep 1
    ready=0
    "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 5 || ready=$?
    [ "$ready" = 1 ] || break
  done
fi
# The cluster in $DIR is running when its pid file names a live process and this port.
ours() {
  [ -f "$DIR/postmaster.pid" ] || return 1
  local pid port
  pid=$(sed -n 1p "$DIR/postmaster.pid" 2>/dev/null || true)
  port=$(sed -n 4p "$DIR/postmaster.pid" 2>/dev/null || true)
  [ -n "$pid" ] && [ "$port" = "$PORT" ] && kill -0 "$pid" 2>/dev/null
}
if [ "$ready" = 0 ] || [ "$ready" = 1 ]; then
  if ours; then
    echo "$URL"
    exit 0
  fi
  echo "postgres.sh: a PostgreSQL server this script did not start (none of $DIR) answers on" \
    "127.0.0.1:$PORT; stop it, or set AWL_PG_PORT to a free port (and AWL_PG_DIR to start" \
    "another cluster)" >&2
  exit 1
fi
if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
  echo "postgres.sh: something that is not PostgreSQL listens on 127.0.0.1:$PORT; stop it," \
    "or set AWL_PG_PORT to a free port" >&2
  exit 1
fi
rm -f "$DIR/postmaster.pid"

if [ ! -f "$DIR/PG_VERSION" ]; then
  rm -rf "$DIR"
  mkdir -p "$DIR"
  chmod 700 "$DIR"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$DIR"
  pwfile=$(mktemp)
  echo "$PASSWORD" >"$pwfile"
  chmod 644 "$pwfile"
  out=$(mktemp)
  if ! as_server "$BIN/initdb" -D "$DIR" -U "$USER_NAME" --pwfile="$pwfile" -A scram-sha-256 \
      -N -E UTF8 --locale=C.UTF-8 >"$out" 2>&1; then
    why=$(grep -E "^initdb: (error|fatal|detail|hint):" "$out" | head -3 | tr '\n' ' ' | sed 's/ *$//')
    cat "$out" >&2
    rm -f "$pwfile" "$out"
    rm -rf "$DIR"
    hint="set AWL_PG_DIR to a folder this user can make"
    if [ "$(id -u)" = 0 ]; then
      hint="as root the server runs as the postgres user, who must be able to reach every"
      hint="$hint folder above $DIR: set AWL_PG_DIR elsewhere (for example under /tmp)"
    fi
    echo "postgres.sh: initdb could not make the cluster in $DIR: ${why:-see its output" \
      "above}; $hint" >&2
    exit 1
  fi
  cat "$out" >&2
  rm -f "$pwfile" "$out"
  cat >>"$DIR/postgresql.conf" <<EOF
# Set by scripts/postgres.sh: tests only, on the loopback address only.
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
max_connections = 300
shared_buffers = 128MB
EOF
fi

if ! as_server "$BIN/pg_ctl" -D "$DIR" -l "$DIR/server.log" -w -t 60 start >&2; then
  tail -5 "$DIR/server.log" >&2 2>/dev/null || true
  echo "postgres.sh: the server in $DIR did not start; its log ($DIR/server.log) says why," \
    "above" >&2
  exit 1
fi
echo "$URL"
