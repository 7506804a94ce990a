#!/usr/bin/env bash
# Build the Go tools the tests run (cached outside the clone; a warm run costs seconds):
# the e2e control plane (tools/e2e/build-bins.sh: kube-apiserver, kube-scheduler,
# kube-controller-manager, kubectl, etcd, kwok), promtool, the Prometheus server and helm.
#
# FAIRSHARE_STRICT=1 (what `make test` sets unless STRICT=0): a tool that cannot be built
# is an error: exit 1 naming each one and why, before any test runs (their tests would
# fail in strict mode anyway). Otherwise: the same list as a warning, exit 0, and the
# tests that need them skip saying why (`make test STRICT=0` on a machine without Go).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
strict=0
case "$(printf '%s' "${FAIRSHARE_STRICT:-}" | tr '[:upper:]' '[:lower:]')" in
  "" | 0 | false | no) ;;
  *) strict=1 ;;
esac
failed=()
for entry in \
  "e2e control plane (kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, etcd, kwok)|e2e/build-bins.sh" \
  "promtool|promtool/build.sh" \
  "prometheus (server, after promtool: it reuses promtool's compiled packages)|prometheus/build.sh" \
  "helm|helm/build.sh"; do
  what="${entry%%|*}" script="${entry#*|}"
  err="$(mktemp)"
  # stdout (progress, the binary's path) goes through; stderr is shown and kept for the summary.
  { bash "$here/$script" 2>&1 1>&3 | tee "$err" >&2; } 3>&1
  if ((PIPESTATUS[0] != 0)); then
    why="$(grep -v '^\[' "$err" | grep -v '^[[:space:]]*$' | tail -n 3 | tr '\n' ' ' | cut -c1-600)"
    failed+=("$what (tools/$script): ${why:-see the output above}")
  fi
  rm -f "$err"
done
if ((${#failed[@]} == 0)); then
  exit 0
fi
if ((strict)); then
  echo "make test: could not build ${#failed[@]} tool(s) the tests need:" >&2
else
  echo "warning: could not build ${#failed[@]} tool(s); the tests that need them skip:" >&2
fi
for f in "${failed[@]}"; do
  echo "  - $f" >&2
done
if ((strict)); then
  echo "Strict mode (FAIRSHARE_STRICT=1, make test's default) does not let their tests skip." \
    "Install Go >= 1.26 and make the Go module proxy reachable, or run \`make test STRICT=0\`" \
    "(their tests skip saying why) or \`make test-unit\`." >&2
  exit 1
fi
