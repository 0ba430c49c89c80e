# Shared by the bench scripts (sourced, not run): processes they start and a wait for HTTP.
#   pids+=($!)            after starting a background process; `cleanup` kills them (also on exit)
#   wait_http URL SECONDS  until URL answers 2xx (curl -f), at most SECONDS; 1 if it never does
pids=()
cleanup() { for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done; wait 2>/dev/null; pids=(); }
trap cleanup EXIT

wait_http() { # url, seconds
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
