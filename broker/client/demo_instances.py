"""SIMULATED instances for SIMULATED clouds (moto's EC2, the Compute fake, a fake libcloud
driver): this machine plays the part of the instances the broker launches there.

Every instance a broker tagged that the cloud lists as pending or running "boots": its boot
script (the real bootstrap from providers.bootstrap, read back from the cloud: EC2 user
data, the GCE `startup-script` metadata, the libcloud driver's user data) runs as a shell
script here, which starts `onepool agent`, exactly as cloud-init or the guest agent would on
the instance. When the cloud stops listing the instance as alive (terminated by the broker,
or by a test playing the cloud), everything the instance ran dies with it: the agent and
every rank it started.

One InstanceBooter serves every cloud; a BootSource per cloud lists its instances and reads
their boot scripts. Per instance, the script gets ONEPOOL_AGENT_HOME (its own folder, standing
for the instance's disk), PATH with this environment's `onepool`, and optionally
ONEPOOL_METADATA_URL (a fake metadata service) and a command prefix such as
`ip netns exec NS` (its own network stack).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from providers.base import TAG_BROKER, TAG_NODE
from providers.local import LocalProcesses

log = logging.getLogger("onepool.demo_instances")


class BootSource(Protocol):
    """One cloud as the booter sees it."""

    def alive(self) -> dict[str, str]:
        """{instance id: node id} of the broker-tagged instances pending or running now."""
        ...

    def boot_script(self, instance_id: str) -> str | None:
        """The script the instance boots with (None: it has none of ours)."""
        ...


class Ec2Instances:
    """EC2 (a boto3 client factory): tags, and the userData attribute."""

    def __init__(self, ec2: Callable[[], Any], broker_id: str | None = None) -> None:
        self.ec2, self.broker_id = ec2, broker_id

    def alive(self) -> dict[str, str]:
        filters = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]
        if self.broker_id:
            filters.append({"Name": f"tag:{TAG_BROKER}", "Values": [self.broker_id]})
        out = {}
        for page in self.ec2().get_paginator("describe_instances").paginate(Filters=filters):
            for r in page["Reservations"]:
                for i in r["Instances"]:
                    tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                    if TAG_NODE in tags:
                        out[i["InstanceId"]] = tags[TAG_NODE]
        return out

    def boot_script(self, instance_id: str) -> str | None:
        raw = self.ec2().describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        value = raw.get("UserData", {}).get("Value")
        return base64.b64decode(value).decode() if value else None


class GceInstances:
    """Compute Engine (a compute_v1.InstancesClient): the broker's ids and the boot script
    are metadata items; instance ids are `zone/name`, as providers.gcp makes them."""

    def __init__(self, instances: Any, project: str) -> None:
        self.instances, self.project = instances, project
        self._scripts: dict[str, str | None] = {}

    def alive(self) -> dict[str, str]:
        from providers.gcp.resources import read_instance, startup_script

        out = {}
        for _zone, scoped in self.instances.aggregated_list(project=self.project):
            for i in scoped.instances:
                inst = read_instance(i)
                if i.status in ("PROVISIONING", "STAGING", "RUNNING") and inst.node_id:
                    out[inst.instance_id] = inst.node_id
                    self._scripts[inst.instance_id] = startup_script(i)
        return out

    def boot_script(self, instance_id: str) -> str | None:
        return self._scripts.get(instance_id)


class LibcloudNodes:
    """A libcloud driver: nodes with the broker's node tag; `script` reads a node's user data
    (where the fake cloud keeps what create_node was given)."""

    def __init__(self, driver: Any, script: Callable[[Any], str | None], tags_extra: str = "tags") -> None:
        self.driver, self.script, self.tags_extra = driver, script, tags_extra
        self._nodes: dict[str, Any] = {}

    def alive(self) -> dict[str, str]:
        from libcloud.compute.types import NodeState

        out = {}
        for n in self.driver.list_nodes():
            node_id = (n.extra.get(self.tags_extra) or {}).get(TAG_NODE)
            if node_id and n.state in (NodeState.RUNNING, NodeState.PENDING, NodeState.STARTING):
                out[n.id] = node_id
                self._nodes[n.id] = n
        return out

    def boot_script(self, instance_id: str) -> str | None:
        return self.script(self._nodes[instance_id])


@dataclass
class Booted:
    instance_id: str
    node: str
    home: Path
    proc: subprocess.Popen[bytes]


class InstanceBooter:
    """Watches a cloud (a BootSource) and boots/kills its instances as they come and go."""

    def __init__(self, source: BootSource, workdir: Path, *,
                 metadata_url: Callable[[str], str | None] = lambda iid: None,
                 prefix: Callable[[str], list[str]] = lambda iid: [], poll_s: float = 0.2) -> None:
        self.source = source
        self.workdir = Path(workdir)
        self.metadata_url, self.prefix, self.poll_s = metadata_url, prefix, poll_s
        self.booted: dict[str, Booted] = {}
        self.history: list[Booted] = []
        self.skipped: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> InstanceBooter:
        self._thread = threading.Thread(target=self._run, name="instance-booter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for b in list(self.booted.values()):
                self._kill(b)
            self.booted.clear()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.tick()
            except Exception:
                log.exception("instance booter: scan failed")

    def tick(self) -> None:
        """One scan: boot new instances, kill the ones the cloud no longer lists as alive."""
        alive = self.source.alive()
        with self._lock:
            for iid in [i for i in self.booted if i not in alive]:
                self._kill(self.booted.pop(iid))
            for iid, node in alive.items():
                if iid not in self.booted and iid not in self.skipped:
                    b = self._boot(iid, node)
                    if b is None:
                        self.skipped.add(iid)
                        continue
                    self.booted[iid] = b
                    self.history.append(b)

    def _boot(self, iid: str, node: str) -> Booted | None:
        """Run the instance's boot script; None if it has none (it boots nothing of ours)."""
        script = self.source.boot_script(iid)
        if not script:
            return None
        home = self.workdir / iid.replace("/", "_")[-120:]
        home.mkdir(parents=True, exist_ok=True)
        (home / "user-data.sh").write_text(script)
        env = {**os.environ, "ONEPOOL_AGENT_HOME": str(home / "agent"),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("ONEPOOL_URL", None)
        env.pop("ONEPOOL_TOKEN", None)
        # A simulated instance never asks a real cloud's metadata address (169.254.169.254 is
        # not this machine's): without a fake service, its agent's watcher gets a refused
        # connection on loopback, as on an instance whose metadata service is down.
        env["ONEPOOL_METADATA_URL"] = self.metadata_url(iid) or "http://127.0.0.1:9"
        bash = shutil.which("bash") or "/bin/bash"
        log_file = open(home / "console.log", "ab")  # noqa: SIM115  (the child holds it)
        proc = subprocess.Popen([*self.prefix(iid), bash, str(home / "user-data.sh")], env=env,
                                stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log_file.close()
        log.info("instance %s (node %s) booted its user data: pid %d", iid, node, proc.pid)
        return Booted(iid, node, home, proc)

    @staticmethod
    def _kill(b: Booted) -> None:
        """The instance is gone: so is everything on it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(b.proc.pid, signal.SIGKILL)
        b.proc.wait(timeout=10)
        runs = b.home / "agent" / "runs"
        if runs.exists():
            LocalProcesses(runs).kill_all()
        log.info("instance %s (node %s) is gone: its agent and ranks were killed", b.instance_id, b.node)

    def kill_agent(self, iid: str) -> None:
        """SIGKILL only the agent of an instance (its ranks stay, as on a real host)."""
        with self._lock:
            b = self.booted[iid]
        os.killpg(b.proc.pid, signal.SIGKILL)
