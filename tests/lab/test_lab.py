"""End to end on the lab of separate machines (tests/lab/conftest.py: set up by the README's
"Across machines" commands as written): the researcher's commands from a laptop that has
only the thin client, a victim that resumes on another box from the object store, and what
the thin client has and lacks."""

from __future__ import annotations

import json
import re
import shlex
import sys
import textwrap

import pytest

from tests.lab.builders import REPO
from tests.lab.conftest import BOXES, ReadmeLab
from tests.lab.harness import wait_until

pytestmark = pytest.mark.e2e

AGENT_RUNS = "/home/ops/.onepool-agent/runs"  # each box's agent folder (its private /home)
SLEEP = "python -c 'import time; time.sleep(600)'"


def _submit(lab: ReadmeLab, *args: str) -> int:
    return int(json.loads(lab.onepool("submit", "--json", *args).stdout)["id"])


def _node(info: dict[str, object], attempt: int = -1) -> str:
    return str(info["attempt_list"][attempt]["alloc"][0][0])  # type: ignore[index]


def _ended(lab: ReadmeLab, *jobs: int) -> None:
    for j in jobs:
        if lab.job(j)["status"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            lab.onepool("cancel", str(j), check=False)
    for j in jobs:
        wait_until(f"job {j} ended", lambda j=j: lab.job(j)["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"),
                   60, step=0.3)


def test_readme_researcher_commands_run_from_the_laptop_as_written(readme_lab: ReadmeLab) -> None:
    """`onepool submit ... -- python /srv/code/train.py`, then `status; logs 7 -f; cancel 7`,
    typed on the laptop: the job runs on a box and finds `python` there (the box's PATH has
    none: its onepool is installed pipx-style), `logs -f` follows it until the cancel ends it."""
    lab = readme_lab
    submit, status, logs, cancel = lab.parts["researchers, from their laptops"][1:]
    out = lab.laptop.sh(submit, env=lab.researcher_env).stdout
    job = int(re.search(r"submitted job (\d+)", out).group(1))  # type: ignore[union-attr]
    listed = lab.laptop.sh(status, env=lab.researcher_env).stdout
    assert "bert" in listed and "vision" in listed, listed
    # `logs -f` right away, as typed: it waits for the job to start if it has not yet
    follow = lab.laptop.spawn(["bash", "-c", logs.replace("7", str(job))], name="logs-f",
                              env=lab.researcher_env)
    log = lab.lab.logs / "laptop-logs-f.log"
    wait_until("the job's output reaches the laptop", lambda: "fresh start" in log.read_text()
               or lab.job(job)["status"] not in ("PENDING", "RUNNING"), 45, step=0.2)
    info = lab.job(job)
    assert info["status"] == "RUNNING" and info["team"] == "vision", (info, log.read_text())
    assert _node(info) in lab.box_of_node
    lab.laptop.sh(cancel.replace("7", str(job)), env=lab.researcher_env)
    assert follow.wait(timeout=60) == 0, log.read_text()
    assert lab.job(job)["status"] == "CANCELLED"


@pytest.mark.parametrize("in_image", [False, True], ids=["on-the-box", "in-a-container"])
def test_a_victim_resumes_on_the_other_box_from_the_object_store(readme_lab: ReadmeLab,
                                                                 in_image: bool) -> None:
    """A low job on one box, a normal one on the other; an urgent one preempts the low job,
    whose checkpoint goes to the bucket; once the other box frees, it resumes there from that
    checkpoint. The boxes share no folder: each sees only its own attempts' folders. In a
    container (issue 26): the victim runs in the test image, checkpoints from inside it, and
    the other box pulls the image itself (cold: the boxes share no image storage either)."""
    lab = readme_lab
    if in_image and lab.images is None:
        pytest.skip("podman cannot run here: see tests/containers (infra/test/install-podman.sh)")
    # in the image (which has no Python of its own) the boxes' interpreter is mounted read-only
    how = ["--image", lab.images.image, "--", sys.executable] if in_image and lab.images else ["--", "python"]
    victim = _submit(lab, "--name", "victim", "--priority", "low", "--gpus", "8", *how,
                     "/srv/code/train.py", "--steps", "400", "--step-s", "0.1", "--ckpt-every", "5")
    filler = _submit(lab, "--name", "filler", "--gpus", "8", "--", *shlex.split(SLEEP))
    urgent = None
    try:
        def running() -> bool:
            states = [lab.job(j)["status"] for j in (victim, filler)]
            assert states[0] != "FAILED", lab.onepool("logs", str(victim), check=False).stdout[-3000:]
            return states == ["RUNNING", "RUNNING"]

        wait_until("victim and filler run", running, 30, step=0.3)
        first = _node(lab.job(victim))
        filler_node = _node(lab.job(filler))
        assert {first, filler_node} == set(lab.box_of_node)
        wait_until("a checkpoint of the victim is committed in the bucket",
                   lambda: any(f"/{victim}/step-" in k and k.endswith("manifest.json")  # its own
                                   for k in lab.bucket_keys()), 30, step=0.3)
        urgent = _submit(lab, "--name", "urgent", "--priority", "urgent", "--gpus", "8", "--",
                         *shlex.split(SLEEP))
        wait_until("the urgent job runs where the victim ran",
                   lambda: lab.job(urgent)["status"] == "RUNNING", 45, step=0.3)
        assert _node(lab.job(urgent)) == first
        assert lab.job(victim)["status"] == "PENDING"
        lab.onepool("cancel", str(filler))
        wait_until("the victim runs again", lambda: lab.job(victim)["attempts"] >= 2
                   and lab.job(victim)["status"] == "RUNNING", 60, step=0.3)
        info = lab.job(victim)
        second = _node(info)
        assert second == filler_node != first
        wait_until("attempt 2 restored the checkpoint", lambda: "resumed from step" in
                   lab.onepool("logs", str(victim)).stdout, 30, step=0.3)
        info = lab.job(victim)
        assert info["resumed_from_step"] is not None and info["resumed_from_step"] >= 4, info
        a1, a2 = (a["id"] for a in info["attempt_list"][:2])
        box1, box2 = lab.box(first), lab.box(second)
        assert f"attempt-{a1}" in box1.ls(AGENT_RUNS) and f"attempt-{a1}" not in box2.ls(AGENT_RUNS)
        assert f"attempt-{a2}" in box2.ls(AGENT_RUNS) and f"attempt-{a2}" not in box1.ls(AGENT_RUNS)
        if in_image:  # each box pulled the image itself, and ran it
            pulls = [json.loads(box.read(f"{AGENT_RUNS}/attempt-{a}/rank-0/image.json"))
                     for box, a in ((box1, a1), (box2, a2))]
            assert [p["cached"] for p in pulls] == [False, False], pulls
            print(f"lab pull_image: {pulls}")
        step = info["resumed_from_step"]
        assert any(f"{step:08d}" in k or f"-{step}/" in k for k in lab.bucket_keys()), lab.bucket_keys()
        for box in BOXES:  # no checkpoint on any box's disk: the bucket is the only place
            # (the checkout itself, bound into each host as installed software, is not a box's disk)
            found = lab.lab.host(box).run(["find", "/home", "/srv", "/tmp", "-path", str(REPO), "-prune",
                                           "-o", "-name", "manifest.json", "-print"]).stdout
            assert found == "", found
    finally:
        _ended(lab, *(j for j in (victim, filler, urgent) if j is not None))


SDK_SCRIPT = textwrap.dedent("""
    import sys
    from broker.sdk import Client
    c = Client()
    hello = "import socket; print('hello from', socket.gethostname())"
    job = c.submit(name="sdk-hello", command=["python", "-c", hello])
    [done] = c.wait([job.id], timeout=60, poll_s=0.2)
    print(done.status, c.logs(job.id).data.strip())
    server = ("broker.state", "broker.control", "broker.api")
    server_side = sorted(m for m in sys.modules if m.startswith(server))
    print("server modules:", server_side)
""")


@pytest.mark.parametrize("argv, env_url", [
    (["onepool", "status"], False),                        # an embedded home on the laptop
    (["onepool", "broker", "--once"], False),
    (["onepool", "agent", "--server", "http://server:8421", "--gpus", "1", "--gpu-type", "A100"], True),
])
def test_the_laptop_has_the_thin_client_only(readme_lab: ReadmeLab, argv: list[str], env_url: bool) -> None:
    """No SQLAlchemy in the laptop's virtualenv; commands needing the server parts say to
    install them (exit 2, no traceback)."""
    lab = readme_lab
    r = lab.laptop.run(["python", "-c", "import sqlalchemy"], check=False)
    assert r.returncode == 1 and "No module named 'sqlalchemy'" in r.stderr
    assert not {"sqlalchemy", "sqlmodel", "fastapi", "numpy", "psutil"} & set(lab.venv.distributions)
    env = {k: v for k, v in lab.researcher_env.items() if env_url or not k.startswith("ONEPOOL_")}
    r = lab.laptop.run(argv, env=env, check=False)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "pip install 'onepool[server]'" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_sdk_works_over_http_from_the_laptop(readme_lab: ReadmeLab) -> None:
    """`from broker.sdk import Client` in the laptop's Python: submit, wait and logs over HTTP,
    the job ran on a box, and nothing of the server's modules was imported."""
    lab = readme_lab
    out = lab.laptop.run(["python", "-c", SDK_SCRIPT], env=lab.researcher_env, timeout=90).stdout
    assert re.search(r"^SUCCEEDED hello from (box0|box1)$", out, re.M), out
    assert "server modules: []" in out, out


CODE_CACHE = "/home/ops/.onepool-agent/code-cache"  # each box's snapshot cache (providers.code_cache)


def _fetches(lab: ReadmeLab) -> int:
    total = 0
    for box in BOXES:
        h = lab.lab.host(box)
        if h.exists(f"{CODE_CACHE}/stats.json"):
            total += json.loads(h.read(f"{CODE_CACHE}/stats.json"))["fetches"]
    return total


def test_a_laptop_folder_runs_on_a_box_that_never_saw_it(readme_lab: ReadmeLab) -> None:
    """`onepool submit --code .` in a folder of the laptop: packed, uploaded through the server
    (the laptop has no store credentials), copied to the pool's bucket, fetched and verified by
    the box, run in a private copy. A second job from the same folder on the same box neither
    uploads nor downloads (counted: the client's note, the boxes' cache counters)."""
    lab = readme_lab
    proj = "/home/ada/proj"
    lab.laptop.write(f"{proj}/hello.py",
                     "import pathlib\nprint('code says', pathlib.Path('data.txt').read_text())\n")
    lab.laptop.write(f"{proj}/data.txt", "hi from the laptop")
    lab.laptop.write(f"{proj}/weights.bin", b"w" * 4096)
    lab.laptop.write(f"{proj}/.onepoolignore", "*.bin\n")
    filler = _submit(lab, "--name", "hold", "--gpus", "8", "--", *shlex.split(SLEEP))  # one box stays busy
    jobs: list[int] = []
    try:
        wait_until("the filler runs", lambda: lab.job(filler)["status"] == "RUNNING", 30, step=0.3)
        before = _fetches(lab)
        notes = []
        for name in ("code-1", "code-2"):
            r = lab.laptop.run(["onepool", "submit", "--json", "--name", name, "--gpus", "8", "--code", ".",
                                "--", "python", "hello.py"], env=lab.researcher_env, cwd=proj)
            jobs.append(int(json.loads(r.stdout)["id"]))
            notes.append(r.stderr)
            wait_until(f"{name} succeeded", lambda: lab.job(jobs[-1])["status"] in ("SUCCEEDED", "FAILED"),
                       45, step=0.3)
            assert lab.job(jobs[-1])["status"] == "SUCCEEDED", lab.onepool("logs", str(jobs[-1])).stdout
            assert "code says hi from the laptop" in lab.onepool("logs", str(jobs[-1])).stdout
        assert "uploaded" in notes[0] and "stored already, not uploaded" in notes[1], notes
        assert _fetches(lab) - before == 1  # the first job's box fetched; the second found it cached
        node = _node(lab.job(jobs[0]))
        assert _node(lab.job(jobs[1])) == node != _node(lab.job(filler))
        box = lab.box(node)
        assert not box.exists(proj)  # the box never saw the laptop's folder
        [digest] = [d for d in box.ls(CODE_CACHE) if len(d) == 64]
        assert box.ls(f"{CODE_CACHE}/{digest}") == ["data.txt", "hello.py"]  # .onepoolignore held
        assert [k for k in lab.bucket_keys() if "/code/" in k] == [f"checkpoints/code/vision/{digest}.tar.gz"]
        # restart phases, reported by the box's agent: shown by `onepool status JOB`
        phases = lambda: lab.job(jobs[1])["attempt_list"][0]["phases"]  # noqa: E731
        wait_until("the phases are reported", phases, 10, step=0.3)
        assert "fetch_code_s" in phases()
        assert "attempt 1: fetch code" in lab.onepool("status", str(jobs[1])).stdout
    finally:
        _ended(lab, filler, *jobs)
