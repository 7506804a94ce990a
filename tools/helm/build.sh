#!/usr/bin/env bash
# Build helm (the Kubernetes package manager CLI) from the helm.sh/helm/v4
# Go module pinned in go.mod beside this script, into a per-version cache outside the
# clone. A warm run costs milliseconds. Prints the binary's path (the only stdout line).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v go >/dev/null 2>&1; then
  echo "helm build: 'go' not found; install Go >= 1.24 to build helm" >&2
  exit 3
fi
version="$(sed -n 's#^[[:space:]]*helm.sh/helm/v4 \(v[^ ]*\).*#\1#p' "$here/go.mod")"
[[ -n "$version" ]] || { echo "helm build: no helm version in $here/go.mod" >&2; exit 2; }
cache="${XDG_CACHE_HOME:-$HOME/.cache}/fairshare/helm/helm-${version}"
mkdir -p "$cache"
# One build at a time per cache: a second caller waits, then finds the binary cached.
exec 9>"$cache/.lock"
flock 9
if [[ ! -x "$cache/helm" ]]; then
  printf '[helm %s] building helm from helm.sh/helm/v4 %s\n' \
    "$(date +%H:%M:%S)" "$version" >&2
  (cd "$here" && CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false -mod=mod" \
    go build -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" -o "$cache/helm.tmp" \
    helm.sh/helm/v4/cmd/helm)
  mv "$cache/helm.tmp" "$cache/helm"
fi
echo "$cache/helm"
