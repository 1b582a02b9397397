#!/usr/bin/env bash
# Installs Debian's podman, buildah, the CNCF distribution registry and a static busybox for the
# container tests (tests/containers/: an image built in the test without any network, pushed to
# a registry on 127.0.0.1, pulled and run by a rank's supervisor), before pytest runs: tests
# never install anything themselves. Called by `make test-deps`. Without root or apt-get it only
# says so; those tests then skip, naming this script.
set -euo pipefail
need=(podman buildah docker-registry busybox)
missing=()
for c in "${need[@]}"; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
if [ "${#missing[@]}" = 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-podman: ${missing[*]} missing and cannot be installed here (needs root and apt-get);" \
         "the container tests will be skipped" >&2
    exit 0
fi
echo "install-podman: apt-get install podman buildah docker-registry busybox-static (about 30 s)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends podman buildah docker-registry busybox-static \
    catatonit >/dev/null
for c in "${need[@]}"; do command -v "$c" >/dev/null; done
