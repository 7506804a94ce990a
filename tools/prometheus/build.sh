#!/usr/bin/env bash
# Build the Prometheus server (the e2e chargeback test scrapes fairshare with it) from the
# Prometheus Go module pinned in tools/promtool/go.mod, the same version as promtool, cached
# outside the clone; prints its path. Built after promtool it reuses most of promtool's
# compiled packages. No web UI assets are embedded (the HTTP API is all the tests use).
here="$(cd "$(dirname "$0")" && pwd)"
exec bash "$here/../go-tool.sh" prometheus github.com/prometheus/prometheus \
  github.com/prometheus/prometheus/cmd/prometheus "$here/../promtool" prometheus
