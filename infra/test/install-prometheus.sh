#!/usr/bin/env bash
# Installs Debian's prometheus (the server and promtool) for the metrics tests
# (tests/observe/: a real Prometheus scrapes a running server and agent; promtool checks and
# unit-tests the alert rules in infra/prometheus/), before pytest runs: tests never install
# anything themselves. Called by `make test`. Without root or apt-get it only says so; those
# tests then skip, naming this script. The package's own service is not started (no systemd in
# the test machine; each test starts its Prometheus in a temporary folder).
set -euo pipefail
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-prometheus: prometheus is missing and cannot be installed here (needs root and apt-get);" \
         "the metrics tests that need it will be skipped" >&2
    exit 0
fi
echo "install-prometheus: apt-get install prometheus (about 20 s)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null && command -v promtool >/dev/null
