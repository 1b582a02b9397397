"""Containers on the lab's boxes (issue 26): a registry on the object store's host, the test
image (tests/containers) pushed to it from this machine, and on each box a podman of its own:
its image storage, run folder and registries.conf under the box's private /srv, so a box pulls
what it runs and holds only what it pulled (the boxes share no disk). This machine's quirks
(tests/containers/conftest.py, and a box's /sys without cgroups) stay in the wrapper and the
node settings given to each agent.
Where podman cannot run, `start` returns None and the container cases skip."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.containers.conftest import QUIRKS, TOOLS, build_and_push, mounts
from tests.lab.harness import Host

REGISTRY_PORT = 5055
CODE = "/srv/code"  # the boxes' job scripts (tests/lab/conftest.py), mounted read-only


@dataclass(frozen=True)
class LabImages:
    registry: str  # host:port of the object store's registry, as the boxes reach it
    image: str

    def settings(self, box: Host) -> dict[str, str]:
        """Give `box` its own podman (under its /srv) and return the agent's node settings."""
        conf = "/srv/containers"
        box.run(["mkdir", "-p", f"{conf}/graph", f"{conf}/run", f"{conf}/tmp"])
        box.write(f"{conf}/storage.conf", f'[storage]\ndriver = "overlay"\ngraphroot = "{conf}/graph"\n'
                                          f'runroot = "{conf}/run"\n')
        box.write(f"{conf}/containers.conf", f'[engine]\ntmp_dir = "{conf}/tmp"\n')
        box.write(f"{conf}/registries.conf", f'[[registry]]\nlocation = "{self.registry}"\ninsecure = true\n')
        box.write("/srv/podman", (
            "#!/bin/sh\n# this box's podman: its own storage; a box's fresh /sys has no cgroup mount,\n"
            "# and crun wants one (a tmpfs: cgroups are disabled anyway, see QUIRKS)\n"
            f"export CONTAINERS_STORAGE_CONF={conf}/storage.conf CONTAINERS_CONF={conf}/containers.conf "
            f"CONTAINERS_REGISTRIES_CONF={conf}/registries.conf\n"
            "exec unshare --mount --propagation private /bin/sh -c "
            "'mount -t tmpfs none /sys/fs/cgroup && exec podman \"$@\"' podman \"$@\"\n"), mode=0o755)
        return {"ONEPOOL_CONTAINER_CLI": "/srv/podman", "ONEPOOL_CONTAINER_GPUS": "none",
                "ONEPOOL_CONTAINER_ARGS": " ".join([*QUIRKS, *mounts(CODE)])}


def start(objstore: Host) -> LabImages | None:
    """The registry on `objstore` and the test image in it; None where podman cannot run."""
    if any(shutil.which(t) is None for t in TOOLS):
        return None  # (tests/containers says which and how to install them)
    registry = f"{objstore.ip}:{REGISTRY_PORT}"
    objstore.write("/srv/registry.yml", f"version: 0.1\nlog: {{level: error}}\n"
                                        f"http: {{addr: 0.0.0.0:{REGISTRY_PORT}}}\n"
                                        "storage: {filesystem: {rootdirectory: /srv/reg}}\n")
    objstore.spawn(["docker-registry", "serve", "/srv/registry.yml"], name="registry")

    def answers() -> bool:
        try:
            urllib.request.urlopen(f"http://{registry}/v2/", timeout=1).close()
            return True
        except OSError:
            return False

    deadline = time.monotonic() + 20
    while not answers():  # (no event to await: another host's daemon)
        if time.monotonic() > deadline:
            print(f"lab: no container cases: the registry on {registry} did not answer")
            return None
        time.sleep(0.1)
    tag = f"localhost/onepool-lab-bb:{secrets.token_hex(4)}"
    image = f"{registry}/onepool/bb:1"
    podman = shutil.which("podman") or "podman"
    why = build_and_push(Path(podman), tag, image)
    subprocess.run([podman, "rmi", "-f", tag], capture_output=True, timeout=60, check=False)
    if why is not None:
        print(f"lab: no container cases: {why}")
        return None
    return LabImages(registry, image)
