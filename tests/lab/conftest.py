"""`readme_lab`: the lab of tests/lab/harness.py set up by the README's "Across machines"
commands as written: a server, two GPU boxes running `onepool agent`, a laptop with only the
thin client, and moto's S3 server as the object store (the one place checkpoints meet).
Made once per module (the namespaces, the laptop's virtualenv and the server are shared)."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.lab import containers as lab_containers
from tests.lab.builders import (
    REPO,
    ThinVenv,
    build_wheel,
    exports,
    install_thin_client,
    pipx_style,
    readme_blocks,
    shell_parts,
)
from tests.lab.containers import LabImages
from tests.lab.harness import BASE_PATH, Host, Lab, wait_until

BOXES = ("box0", "box1")
BUCKET = "lab-checkpoints"
S3_PORT = 5000
TRAIN = REPO / "examples" / "train_numpy.py"  # the boxes' /srv/code/train.py


@dataclass
class ReadmeLab:
    """The lab after the README's setup: who is who, and the environments of its users."""

    lab: Lab
    parts: dict[str, list[str]]  # the README's commands, by part
    venv: ThinVenv
    admin_env: dict[str, str]  # the laptop's environment after the admin's `export`
    researcher_env: dict[str, str]  # ... after the researcher's (a member token of team vision)
    box_of_node: dict[str, str] = field(default_factory=dict)  # gpu-box-0 -> box0
    timings: dict[str, float] = field(default_factory=dict)
    images: LabImages | None = None  # the registry and test image; None: podman cannot run here

    @property
    def laptop(self) -> Host:
        return self.lab.host("laptop")

    def box(self, node: str) -> Host:
        return self.lab.host(self.box_of_node[node])

    def onepool(self, *args: str, env: dict[str, str] | None = None, check: bool = True) -> Any:
        """`onepool ARGS` on the laptop as the researcher (or `env`)."""
        return self.laptop.onepool(*args, env=env or self.researcher_env, check=check)

    def job(self, job_id: int) -> dict[str, Any]:
        return json.loads(self.onepool("status", str(job_id), "--json").stdout)

    def bucket_keys(self) -> list[str]:
        """Every key in the object store's bucket (read from this machine over the bridge)."""
        r = httpx.get(f"http://{self.lab.host('objstore').ip}:{S3_PORT}/{BUCKET}?list-type=2", timeout=10)
        return re.findall(r"<Key>([^<]+)</Key>", r.text)


def _aws(objstore: Host) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": f"http://objstore:{S3_PORT}"}


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
        return True
    except httpx.TransportError:
        return False


def _start_server(server: Host, objstore: Host, parts: dict[str, list[str]], config: str) -> str:
    """The server machine's part of the README, as written: apply, an admin token, the server.
    Returns the admin token `token create` printed."""
    server.env.update({**pipx_style(server, "/home/ops"), **_aws(objstore)})
    server.cwd = "/srv/lab"
    server.write("/srv/lab/onepool.yaml", config)
    srv = parts["the server machine"]
    assert [c.split()[:2] for c in srv] == [["onepool", "apply"], ["onepool", "token"], ["onepool", "server"]]
    server.sh(srv[0])
    admin_token = re.findall(r"op_\S+", server.sh(srv[1]).stdout)[-1]
    server.spawn(["bash", "-c", srv[2]], name="server")
    wait_until("the server answers", lambda: _answers(f"http://{server.ip}:8421/v1/healthz"), 30)
    return admin_token


@pytest.fixture(scope="module")
def readme_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReadmeLab]:
    logs = tmp_path_factory.mktemp("lab")
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    lab = Lab.start(["server", *BOXES, "laptop", "objstore"], logs / "hosts")
    timings["namespaces_s"] = time.monotonic() - t0
    try:
        yield _setup(lab, logs, timings, t0)
    finally:
        lab.close()


def _setup(lab: Lab, logs: Path, timings: dict[str, float], t0: float) -> ReadmeLab:
    shell, config = readme_blocks()
    parts = shell_parts(shell)
    server, laptop, objstore = lab.host("server"), lab.host("laptop"), lab.host("objstore")

    # the object store: moto's S3 server on its own host, one bucket
    objstore.spawn([sys.executable, "-m", "moto.server", "-H", "0.0.0.0", "-p", str(S3_PORT)], name="s3")
    wait_until("the object store answers", lambda: _answers(f"http://{objstore.ip}:{S3_PORT}/"), 20)
    httpx.put(f"http://{objstore.ip}:{S3_PORT}/{BUCKET}", timeout=10).raise_for_status()
    images = lab_containers.start(objstore)  # a registry beside it, and the test image (issue 26)

    # the laptop: `pip install onepool` (the thin client only), while the server starts
    def laptop_install() -> ThinVenv:
        t = time.monotonic()
        wheel = build_wheel(logs / "wheel")
        timings["wheel_s"] = time.monotonic() - t
        t = time.monotonic()
        venv = install_thin_client(laptop, wheel, "/home/ada/venv")
        timings["thin_venv_s"] = time.monotonic() - t
        return venv

    with ThreadPoolExecutor(1) as pool:
        installing = pool.submit(laptop_install)
        admin_token = _start_server(server, objstore, parts, config)
        venv = installing.result()
    laptop_env = {"HOME": "/home/ada", "PATH": f"{venv.bin}:{BASE_PATH}"}
    laptop.env.update(laptop_env)
    laptop.cwd = "/home/ada"

    # an admin, anywhere (here: the laptop, over HTTP)
    adm = parts["an admin, anywhere"]
    admin_env = {**laptop_env, **{k: v.replace("op_...", admin_token) for k, v in exports(adm[0]).items()}}
    member_token = re.findall(r"op_\S+", laptop.sh(adm[1], env=admin_env).stdout)[-1]

    # each GPU box: a join token from the admin, then the README's agent command
    box_of_node: dict[str, str] = {}
    agent_line = "; ".join(parts["each GPU box"])
    for i, name in enumerate(BOXES):
        node = f"gpu-box-{i}"
        out = laptop.sh(adm[2].replace("gpu-box-0", node), env=admin_env).stdout
        join = re.findall(r"opj_\S+", out)[-1]
        box = lab.host(name)
        box.env.update({**pipx_style(box, "/home/ops"), **_aws(objstore),
                        **(images.settings(box) if images is not None else {})})
        box.cwd = "/home/ops"
        box.write("/srv/code/train.py", TRAIN.read_bytes())
        line = agent_line.replace("opj_...", join).replace("[", "").replace("]", "")
        box.spawn(["bash", "-c", line], name="agent")
        box_of_node[node] = name

    def nodes_up() -> bool:
        rows = json.loads(laptop.run(["onepool", "node", "list", "--json"], env=admin_env).stdout)
        return sorted(r["id"] for r in rows if r["state"] == "up" and r["agent_seen_s_ago"] is not None) \
            == sorted(box_of_node)

    wait_until("both boxes' agents joined", nodes_up, 30, step=0.5)

    res = parts["researchers, from their laptops"]
    researcher_env = {**laptop_env, **{k: v.replace("op_...", member_token)
                                       for k, v in exports(res[0]).items()}}
    timings["setup_s"] = time.monotonic() - t0
    (logs / "timings.json").write_text(json.dumps(timings, indent=2))
    print(f"lab timings: {timings}")  # shown with -s; also in the lab's log folder
    return ReadmeLab(lab, parts, venv, admin_env, researcher_env, box_of_node, timings, images)
