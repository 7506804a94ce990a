#!/usr/bin/env bash
# Build promtool (Prometheus' rule checker and rule unit-test runner) from the Prometheus
# Go module pinned in go.mod beside this script, cached outside the clone; prints its path.
here="$(cd "$(dirname "$0")" && pwd)"
exec bash "$here/../go-tool.sh" promtool github.com/prometheus/prometheus \
  github.com/prometheus/prometheus/cmd/promtool "$here" prometheus
