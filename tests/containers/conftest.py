"""Real containers for the image tests: podman, a registry on 127.0.0.1 and a tiny image built
here without any network (a static busybox in an empty image), once per test session.

This machine's three quirks (../shared/notes/containers-local.md) stay here, in the node
settings the tests give the broker (providers.container): a wrapper for podman that runs it in
a private mount namespace without the cgroup v2 mount and reads a registries.conf marking the
loopback registry insecure (ONEPOOL_CONTAINER_CLI), and explicit rlimits with cgroups disabled
(ONEPOOL_CONTAINER_ARGS). A real GPU host needs none of them. The image holds no Python: the
tests mount this machine's interpreter, its virtualenv and the checkout read-only (also through
ONEPOOL_CONTAINER_ARGS), the way an image with Python would provide them. No GPUs here:
ONEPOOL_CONTAINER_GPUS=none (the CDI and --gpus flags are checked by table tests).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("podman", "buildah", "docker-registry", "busybox", "unshare")
QUIRKS = ["--cgroups=disabled", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]


@dataclass(frozen=True)
class Lab:
    """The session's registry and image, and the node settings that run containers here."""

    registry: str  # 127.0.0.1:PORT
    image: str  # the test image in that registry
    cli: Path  # the podman wrapper
    settings: dict[str, str]  # ONEPOOL_CONTAINER_* for the broker's environment

    def podman(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.cli), *args], capture_output=True, text=True, check=check,
                              timeout=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(*argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, **kw)  # type: ignore[call-overload]


def build_and_push(cli: Path, tag: str, image: str, image_mb: int = 0) -> str | None:
    """Build the test image (a static busybox, and /bin/sh linked to it, in an empty image: no
    network, no base image; with `image_mb`, a layer of that many MiB of random bytes) as `tag`
    in this machine's storage and push it as `image` (a plain-HTTP registry). Returns why that
    cannot be done here, or None."""
    c = _run("buildah", "from", "scratch").stdout.strip()
    work = Path(tempfile.mkdtemp())
    try:
        (work / "links").mkdir()
        (work / "links" / "sh").symlink_to("busybox")  # /bin/sh, as every real image has (setup runs in it)
        steps = [("buildah", "copy", c, shutil.which("busybox") or "/bin/busybox", "/bin/busybox"),
                 ("buildah", "copy", c, str(work / "links"), "/bin/"),
                 *([("buildah", "copy", c, str(_blob(work, image_mb)), "/blob.bin")] if image_mb else []),
                 ("buildah", "config", "--cmd", "/bin/busybox sh", c),
                 ("buildah", "commit", "-q", "--rm", c, tag),
                 (str(cli), "push", "-q", "--tls-verify=false", tag, image)]
        for step in steps:
            r = _run(*step)
            if r.returncode != 0:
                return f"cannot build the test image here ({' '.join(step[:2])}): {r.stderr.strip()[-300:]}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return None


def _blob(d: Path, mb: int) -> Path:
    """`mb` MiB of random bytes (no compression gain): an image layer of that size."""
    path = d / "blob.bin"
    path.write_bytes(os.urandom(mb * 1024 * 1024))
    return path


def mounts(*more: str) -> list[str]:
    """This machine's interpreter, virtualenv and checkout (and `more`), read-only: the test
    image has none of them."""
    paths = ["/usr", sys.base_prefix, sys.prefix, str(ROOT), *more]
    out = []
    for p in dict.fromkeys(paths):
        out += ["--volume", f"{p}:{p}:ro"]
    for link, real in (("/lib", "/usr/lib"), ("/lib64", "/usr/lib64")):  # merged /usr: the loader
        if Path(real).is_dir():
            out += ["--volume", f"{real}:{link}:ro"]
    return out


class LabUnavailable(Exception):
    """This machine cannot run the lab (a tool missing, the registry or podman failing): why."""


@contextlib.contextmanager
def registry_lab(d: Path, image_mb: int = 0) -> Iterator[Lab]:
    """The registry on a free loopback port (its storage in `d`) with the test image pushed to it
    (plus `image_mb` MiB of random bytes in a layer of its own, for a pull of that size), and the
    node settings that run it here; all removed after. Raises LabUnavailable."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise LabUnavailable(f"{', '.join(missing)} not installed: run infra/test/install-podman.sh "
                             "(make test-deps)")
    port = _free_port()
    registry = f"127.0.0.1:{port}"
    (d / "registries.conf").write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    cli = d / "podman"
    cli.write_text(
        "#!/bin/sh\n# podman on this test machine: a private mount namespace without the cgroup v2\n"
        "# mount (crun refuses the v1/v2 hybrid), and the loopback registry marked insecure\n"
        f"export CONTAINERS_REGISTRIES_CONF={d / 'registries.conf'}\n"
        "exec unshare --mount --propagation private /bin/sh -c "
        "'umount /sys/fs/cgroup/unified 2>/dev/null; exec podman \"$@\"' podman \"$@\"\n")
    cli.chmod(0o755)
    (d / "reg.yml").write_text(f"version: 0.1\nlog: {{level: error}}\nhttp: {{addr: {registry}}}\n"
                               f"storage: {{filesystem: {{rootdirectory: {d / 'store'}}}}}\n")
    reg = subprocess.Popen(["docker-registry", "serve", str(d / "reg.yml")], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    tag = f"localhost/onepool-test-bb:{port}"
    image = f"{registry}/onepool/bb:1"
    lab = Lab(registry, image, cli, {"ONEPOOL_CONTAINER_CLI": str(cli), "ONEPOOL_CONTAINER_GPUS": "none",
                                     "ONEPOOL_CONTAINER_ARGS": " ".join([*QUIRKS, *mounts()])})
    try:
        deadline = time.monotonic() + 20
        while True:  # the registry answers /v2/ once it listens
            try:
                urllib.request.urlopen(f"http://{registry}/v2/", timeout=1).close()
                break
            except OSError:
                if reg.poll() is not None or time.monotonic() > deadline:
                    raise LabUnavailable(f"the registry on {registry} did not start") from None
                time.sleep(0.05)
        why = build_and_push(cli, tag, image, image_mb)
        if why is not None:
            raise LabUnavailable(why)
        probe = lab.podman("run", "--rm", *QUIRKS, tag, "/bin/busybox", "true", check=False)
        if probe.returncode != 0:
            raise LabUnavailable(f"podman cannot run a container here: {probe.stderr.strip()[-300:]}")
        lab.podman("rmi", "-f", tag, check=False)  # the first rank pulls it cold
        yield lab
    finally:
        lab.podman("rmi", "-f", tag, image, check=False)
        reg.terminate()
        reg.wait(timeout=10)


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    try:
        with registry_lab(tmp_path_factory.mktemp("containers")) as got:
            yield got
    except LabUnavailable as e:
        pytest.skip(str(e))
