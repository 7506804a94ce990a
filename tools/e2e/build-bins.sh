#!/usr/bin/env bash
# Build the e2e control plane (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, kwok) from Go modules into a per-version cache
# outside the clone, and link .e2e/bin to it. Binaries already built for the
# pinned versions are skipped, so a warm run costs seconds.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=/dev/null
source "$here/versions.env"
if ! command -v go >/dev/null 2>&1; then
  echo "build-bins: 'go' not found; install Go >= 1.24 (https://go.dev/dl/) to build the e2e control plane" >&2
  exit 3
fi
cache="${XDG_CACHE_HOME:-$HOME/.cache}/fairshare/e2e/k8s-${KUBE_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}"
bin="$cache/bin"
mkdir -p "$bin"
# One build at a time per cache: a second caller waits, then finds the binaries cached.
exec 9>"$cache/.lock"
flock 9
export CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false"
export GOFLAGS="$GOFLAGS -mod=mod"
minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
ldf="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldf="$ldf -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

step() { printf '[build-bins %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

for cmd in kube-apiserver kube-scheduler kube-controller-manager kubectl; do
  if [[ -x "$bin/$cmd" ]]; then step "$cmd cached"; continue; fi
  step "building $cmd $KUBE_VERSION (cold builds take many minutes)"
  (cd "$here/k8s" && go build -ldflags "$ldf" -o "$bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
  mv "$bin/$cmd.tmp" "$bin/$cmd"
done
if [[ ! -x "$bin/etcd" ]]; then
  step "building etcd $ETCD_VERSION"
  (cd "$here/etcd" && go build -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$bin/etcd.tmp" "$bin/etcd"
else step "etcd cached"; fi
if [[ ! -x "$bin/kwok" ]]; then
  step "building kwok $KWOK_VERSION"
  tmp="$(mktemp -d)"
  GOBIN="$tmp" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  mv "$tmp/kwok" "$bin/kwok"; rmdir "$tmp"
else step "kwok cached"; fi
mkdir -p "$root/.e2e"
ln -sfn "$bin" "$root/.e2e/bin"
"$bin/kube-apiserver" --version
step "binaries ready in $bin"
