# Shared by the peer scripts (source it): one server at a time, in its own session (a
# SIGINT sent to the script's process group must not reach llama-server, which handles it).
#
#   start_server LOG PORT -- command...   # start, wait for a one-token completion; sets SERVER_PID
#   stop_server                           # stop it and wait

start_server() {
  local log=$1 port=$2
  shift 3
  if curl -s -o /dev/null "http://127.0.0.1:$port/health"; then
    echo "port $port is taken by another server: stop it first" >&2
    exit 1
  fi
  setsid "$@" > "$log" 2>&1 < /dev/null &
  SERVER_PID=$!
  trap 'kill $SERVER_PID 2>/dev/null || true' EXIT
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$port/completion" -H 'Content-Type: application/json' \
      -d '{"prompt": "a", "n_predict": 1}' > /dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "server on port $port did not come up: see $log" >&2
  return 1
}

stop_server() {
  kill "$SERVER_PID" 2> /dev/null || true
  wait "$SERVER_PID" 2> /dev/null || true
  trap - EXIT
}
