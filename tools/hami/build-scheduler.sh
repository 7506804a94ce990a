#!/usr/bin/env bash
# Build HAMi's scheduler extender (./cmd/scheduler) for the cluster benchmark into a
# per-version cache outside the clone, with a copy of its Helm chart beside it (the bench
# renders the chart for the extender's flags, its device config and the
# KubeSchedulerConfiguration). Prints the binary's path (the only stdout line); the chart
# is <dir of the binary>/chart. Nothing of HAMi is kept in the repository.
#   build-scheduler.sh [VERSION]        (default v2.9.0)
# Source, first that works: $FAIRSHARE_HAMI_SRC (a HAMi source tree of that version), the
# cached tree $XDG_CACHE_HOME/fairshare/hami-src-VERSION, the Go module proxy. The tree is
# copied before building (never modified in place); dependencies come from the Go module
# proxy. Exit 3 with the reason on stderr when there is no Go or no source.
set -euo pipefail
version="${1:-v2.9.0}"
# HAMi's go.mod has no /v2 suffix, so the proxy knows a tag by a pseudo-version.
declare -A pseudo=([v2.9.0]=v0.0.0-20260519091452-3a006c6ae2f0)
base="${XDG_CACHE_HOME:-$HOME/.cache}/fairshare"
src="${FAIRSHARE_HAMI_SRC:-}"
tag="$version"
[[ -n "$src" ]] && tag="$version-local"
cache="$base/hami-scheduler/$tag"
mkdir -p "$cache"
# One build at a time per cache: a second caller waits, then finds the binary cached.
exec 9>"$cache/.lock"
flock 9
if [[ -x "$cache/hami-scheduler" && -f "$cache/chart/Chart.yaml" ]]; then
  echo "$cache/hami-scheduler"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "HAMi build: 'go' not found; install Go >= 1.26 to build HAMi's scheduler" >&2
  exit 3
fi
if [[ -z "$src" && -f "$base/hami-src-$version/go.mod" ]]; then
  src="$base/hami-src-$version"
fi
if [[ -z "$src" ]]; then
  mod="github.com/Project-HAMi/HAMi@${pseudo[$version]:-$version}"
  if ! got="$(cd "$cache" && GOFLAGS=-mod=mod go mod download -json "$mod" 2>&1)"; then
    echo "HAMi build: no source tree (set FAIRSHARE_HAMI_SRC to one) and the Go module" \
      "proxy did not serve $mod: $(printf '%s' "$got" | tr '\n' ' ' | cut -c1-300)" >&2
    exit 3
  fi
  src="$(printf '%s' "$got" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
fi
if [[ ! -f "$src/go.mod" || ! -d "$src/cmd/scheduler" || ! -d "$src/charts/hami" ]]; then
  echo "HAMi build: $src is not a HAMi source tree (no go.mod, cmd/scheduler, charts/hami)" >&2
  exit 3
fi
if [[ ! -x "$cache/hami-scheduler" ]]; then
  printf '[hami %s] building HAMi scheduler %s from %s\n' "$(date +%H:%M:%S)" "$version" \
    "$src" >&2
  rm -rf "$cache/src"
  cp -r "$src" "$cache/src"
  chmod -R u+w "$cache/src"
  (cd "$cache/src" && GOFLAGS="-trimpath -buildvcs=false -mod=mod" \
    go build -ldflags "-s -w" -o "$cache/hami-scheduler.tmp" ./cmd/scheduler)
  mv "$cache/hami-scheduler.tmp" "$cache/hami-scheduler"
  rm -rf "$cache/src"
fi
rm -rf "$cache/chart.tmp"
cp -r "$src/charts/hami" "$cache/chart.tmp"
chmod -R u+w "$cache/chart.tmp"
rm -rf "$cache/chart"
mv "$cache/chart.tmp" "$cache/chart"
echo "$cache/hami-scheduler"
