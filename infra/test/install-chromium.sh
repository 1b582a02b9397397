#!/usr/bin/env bash
# Installs Debian's chromium for the dashboard's browser test (tests/dashboard/test_browser_e2e.py),
# before pytest runs: tests never install anything themselves. Called by `make test`.
# Without root or apt-get it only says so; the browser test then skips, naming this script.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: chromium is missing and cannot be installed here (needs root and apt-get);" \
         "the dashboard's browser test will be skipped" >&2
    exit 0
fi
echo "install-chromium: apt-get install chromium (about 20 s)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
command -v chromium >/dev/null
