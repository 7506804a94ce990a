#!/usr/bin/env bash
# Build helm (the Kubernetes package manager CLI) from the helm.sh/helm/v4 Go module pinned
# in go.mod beside this script, cached outside the clone; prints its path.
here="$(cd "$(dirname "$0")" && pwd)"
exec bash "$here/../go-tool.sh" helm helm.sh/helm/v4 helm.sh/helm/v4/cmd/helm "$here" helm \
  "-X helm.sh/helm/v4/internal/version.version=@VERSION@"
