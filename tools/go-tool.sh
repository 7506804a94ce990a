#!/usr/bin/env bash
# Build one Go command from a module pinned in a go.mod, into a per-version cache outside
# the clone (a warm run costs milliseconds), and print the binary's path (the only stdout
# line). Used by tools/<tool>/build.sh:
#   go-tool.sh TOOL MODULE PACKAGE GOMOD_DIR CACHE_PREFIX [EXTRA_LDFLAGS]
# e.g. go-tool.sh promtool github.com/prometheus/prometheus \
#        github.com/prometheus/prometheus/cmd/promtool tools/promtool prometheus
# caches $XDG_CACHE_HOME/fairshare/promtool/prometheus-<version>/promtool.
set -euo pipefail
tool="$1" module="$2" package="$3" dir="$4" prefix="$5" ldextra="${6:-}"
if ! command -v go >/dev/null 2>&1; then
  echo "$tool build: 'go' not found; install Go >= 1.24 to build $tool" >&2
  exit 3
fi
version="$(sed -n "s#^[[:space:]]*${module} \\(v[^ ]*\\).*#\\1#p" "$dir/go.mod")"
[[ -n "$version" ]] || { echo "$tool build: no $module version in $dir/go.mod" >&2; exit 2; }
cache="${XDG_CACHE_HOME:-$HOME/.cache}/fairshare/$tool/${prefix}-${version}"
mkdir -p "$cache"
# One build at a time per cache: a second caller waits, then finds the binary cached.
exec 9>"$cache/.lock"
flock 9
if [[ ! -x "$cache/$tool" ]]; then
  printf '[%s %s] building %s from %s %s\n' "$tool" "$(date +%H:%M:%S)" "$tool" "$module" \
    "$version" >&2
  (cd "$dir" && CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false -mod=mod" \
    go build -ldflags "-s -w ${ldextra//@VERSION@/$version}" -o "$cache/$tool.tmp" "$package")
  mv "$cache/$tool.tmp" "$cache/$tool"
fi
echo "$cache/$tool"
