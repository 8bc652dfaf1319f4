#!/usr/bin/env bash
# `make demo`: a server on the default SQLite file, a real Keras run streaming to it, and the
# dashboard URL. The server stays up after training so the run can be explored; Ctrl-C stops it.
set -euo pipefail

PY=${PY:-.venv/bin/python}
PORT=${PORT:-8600}
DB=${DB:-demo-data/trainvitals.db}
URL="http://127.0.0.1:$PORT"
mkdir -p "$(dirname "$DB")"

healthy() { "$PY" -c "import urllib.request; urllib.request.urlopen('$URL/healthz', timeout=1)" 2>/dev/null; }
# Another server on the port would take the demo's run as its own, and print its URL as ours.
if healthy; then
  echo "port $PORT already has a trainvitals server: stop it, or PORT=8601 make demo" >&2
  exit 1
fi

"$PY" -m trainvitals serve --port "$PORT" --db "$DB" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
# Ctrl-C is how the demo ends: a clean exit, not make's "Error 1".
trap 'echo; echo "  Stopped."; exit 0' INT TERM

for _ in $(seq 1 100); do
  if healthy; then
    break
  fi
  kill -0 $server 2>/dev/null || { echo "the server did not start (is port $PORT taken? PORT=8601 make demo)" >&2; exit 1; }
  sleep 0.2
done

echo
echo "  Dashboard: $URL/"
echo
# A failure scenario may end the training process (the leak under a memory limit is OOM-killed):
# the server stays up either way, so the dashboard can show how it ended.
status=0
"$PY" -m trainvitals demo --server "$URL" "$@" || status=$?
echo
if [ "$status" -eq 0 ]; then
  echo "  Training finished. The dashboard stays up at $URL/ ; press Ctrl-C to stop the server."
else
  echo "  Training ended with exit status $status. The dashboard stays up at $URL/ ; press Ctrl-C to stop the server."
fi
wait $server
