#!/usr/bin/env bash
# Build promtool (Prometheus' rule checker and rule unit-test runner) from the Prometheus
# Go module pinned in go.mod beside this script, into a per-version cache outside the
# clone. A warm run costs milliseconds. Prints the binary's path (the only stdout line).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v go >/dev/null 2>&1; then
  echo "promtool build: 'go' not found; install Go >= 1.24 to build promtool" >&2
  exit 3
fi
version="$(sed -n 's#^[[:space:]]*github.com/prometheus/prometheus \(v[^ ]*\).*#\1#p' "$here/go.mod")"
[[ -n "$version" ]] || { echo "promtool build: no prometheus version in $here/go.mod" >&2; exit 2; }
cache="${XDG_CACHE_HOME:-$HOME/.cache}/fairshare/promtool/prometheus-${version}"
mkdir -p "$cache"
# One build at a time per cache: a second caller waits, then finds the binary cached.
exec 9>"$cache/.lock"
flock 9
if [[ ! -x "$cache/promtool" ]]; then
  printf '[promtool %s] building promtool from github.com/prometheus/prometheus %s\n' \
    "$(date +%H:%M:%S)" "$version" >&2
  (cd "$here" && CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false -mod=mod" \
    go build -ldflags "-s -w" -o "$cache/promtool.tmp" \
    github.com/prometheus/prometheus/cmd/promtool)
  mv "$cache/promtool.tmp" "$cache/promtool"
fi
echo "$cache/promtool"
