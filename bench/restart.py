"""Restart overhead, phase by phase (issue 26): from an attempt's placement to the first line
of the job's own code, for a job without a code snapshot (the baseline: the job's start-up as
onepool always paid it), with its snapshot cached on the node, and with it cold (fetched from
the store, verified, unpacked); with setup commands, cached and cold; in a container image
(code cached), pulled cold from a registry and cached on the node.

    .venv/bin/python bench/restart.py [--quick] [--code-mb 20] [--image-mb 50] [--reps 5] [--no-image]
        -> bench/results/restart.json

Set-up: one process runs the embedded broker (SQLite) and the engine cycling on the system
clock over a local pool whose ranks run under the real supervisor (providers.local), as on an
agent's node. The job is `python job.py`, whose first line records time.time(); the attempt's
`started_at` is the placement (the same clock). Per attempt the node's phases (fetch_code_s,
pull_image_s, setup_s) come from the attempt's record (broker.phases).

The image cases use the container tests' lab (tests/containers/conftest.py: podman, a registry
on loopback, an image built here without network: a static busybox plus `--image-mb` MiB of
random bytes in a layer of its own; this machine's podman quirks in the node settings). The
image holds no Python: the job's interpreter and this checkout are mounted read-only, as an
image with Python would provide them. "Cold" removes the image from the node first.

Assumptions that favour onepool, reported in the JSON: the store is a local folder (file://):
a cold fetch pays no network (on a real bucket add size / bandwidth); the code is random bytes
in a few files (no compression gain, few files to copy); the registry is on loopback (a cold
pull pays no network: on a real registry add size / bandwidth) and the image small (its size is
in the JSON); one rank per attempt; a 2-core machine shared with others.
`summary.cached_overhead_s` is the median, over the cached runs, of placement -> the job's first
line MINUS the baseline's median (what a cached snapshot adds to the job's own start-up);
`summary.image_cached_overhead_s` the same with the image cached too (it includes the container
runtime's own start, ~podman run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# as the tests: ranks of a root broker run as root here (this machine's virtualenv is not
# executable by `nobody`); the copy is chowned to the rank's user otherwise (a little more time)
os.environ.setdefault("ONEPOOL_RUN_AS", "root")

from broker.client.sdk import Client  # noqa: E402
from broker.clock import SystemClock  # noqa: E402
from broker.control.engine import Engine  # noqa: E402
from broker.spec import parse_config  # noqa: E402
from providers.local import LocalProcesses  # noqa: E402
from tests.containers.conftest import LabUnavailable, registry_lab  # noqa: E402

JOB = "import time, pathlib\nt = time.time()\npathlib.Path('{out}').write_text(repr(t))\n"


def _project(root: Path, mb: int, salt: str, out: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "job.py").write_text(JOB.format(out=out))
    for i in range(4):
        (root / f"blob{i}.bin").write_bytes(os.urandom(mb * 1024 * 1024 // 4))
    (root / "salt.txt").write_text(salt)
    return root


def _run(c: Client, eng: Engine, out: Path, **spec: Any) -> dict[str, Any]:
    out.unlink(missing_ok=True)
    j = c.submit(name="bench", team="research", command=[sys.executable, "job.py"], **spec).id
    deadline = time.monotonic() + 300
    while c.get(j).status not in ("SUCCEEDED", "FAILED"):
        eng.cycle()
        eng.executor.wait_for_change(0.02)  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise SystemExit(f"job {j} did not end in 300 s")
    for _ in range(3):  # the phases of a finished attempt are read by the cycles that saw it run
        eng.cycle()
    info = c.get(j)
    if info.status != "SUCCEEDED":
        raise SystemExit(f"job {j} failed: {c.logs(j).data[-2000:]}")
    a = info.attempt_list[0]
    first_line = float(out.read_text())
    return {"to_first_line_s": round(first_line - a.started_at, 3), **(a.phases or {})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="3 runs of each, 5 MB of code")
    ap.add_argument("--code-mb", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--image-mb", type=int, default=50, help="the image's random layer (MiB)")
    ap.add_argument("--no-image", action="store_true", help="skip the image cases")
    args = ap.parse_args()
    reps, mb = (3, 5) if args.quick else (args.reps, args.code_mb)
    image_mb = 20 if args.quick else args.image_mb
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        t = Path(tmp)
        lab, image_note = None, "skipped (--no-image)"
        if not args.no_image:
            (t / "lab").mkdir()
            try:
                lab = stack.enter_context(registry_lab(t / "lab", image_mb))
            except LabUnavailable as e:
                image_note = f"skipped: {e}"
        if lab is not None:  # this process is the node: its container settings, the job's output folder
            os.environ.update(lab.settings)
            (t / "out").mkdir()
            os.environ["ONEPOOL_CONTAINER_ARGS"] += f" --volume {t / 'out'}:{t / 'out'}:rw"
        c = Client(t / "home", clock=SystemClock())
        c.apply(parse_config({"pools": [{"name": "a100", "gpu_type": "A100", "gpus_per_node": 1, "nodes": 1}],
                              "teams": [{"name": "research"}],
                              "broker": {"cycle_s": 0.05, "grace_s": 5, "min_run_s": 0}}))
        eng = Engine(c.store, SystemClock(), LocalProcesses(c.store.home / "runs"))
        out = t / "out" / "first-line"
        out.parent.mkdir(exist_ok=True)
        rows: dict[str, list[dict[str, Any]]] = {k: [] for k in
                                                  ("baseline", "code_cold", "code_cached", "setup_cold",
                                                   "setup_cached", "image_cold", "image_cached")}
        base = _project(t / "base", 0, "base", out)
        for i in range(reps):
            rows["baseline"].append(_run(c, eng, out, workdir=str(base)))
            proj = _project(t / f"p{i}", mb, f"salt-{i}", out)  # a new digest: cold on the node
            rows["code_cold"].append(_run(c, eng, out, code=str(proj)))
            rows["code_cached"].append(_run(c, eng, out, code=str(proj)))
            setup = [f"echo setup {i}; sleep 0.2"]  # a new setup digest: it runs once, then cached
            rows["setup_cold"].append(_run(c, eng, out, code=str(proj), setup=setup))
            rows["setup_cached"].append(_run(c, eng, out, code=str(proj), setup=setup))
            if lab is not None:
                lab.podman("rmi", "-f", lab.image, check=False)  # cold: the node holds no layer of it
                rows["image_cold"].append(_run(c, eng, out, code=str(proj), image=lab.image))
                rows["image_cached"].append(_run(c, eng, out, code=str(proj), image=lab.image))
        if lab is not None:
            size = lab.podman("image", "inspect", "--format", "{{.Size}}", lab.image).stdout.strip()
            image_note = (f"{int(size) / 1e6:.1f} MB (a static busybox and {image_mb} MiB of random bytes), "
                          "pulled from a registry on 127.0.0.1")
        eng.capacity.close()

    def med(case: str, key: str) -> float | None:
        vals = [r[key] for r in rows[case] if isinstance(r.get(key), int | float)]
        return round(statistics.median(vals), 3) if vals else None

    table = {case: {k: med(case, k) for k in ("to_first_line_s", "fetch_code_s", "pull_image_s", "setup_s")}
             for case in rows if rows[case]}
    baseline = table["baseline"]["to_first_line_s"] or 0.0
    summary = {
        "cached_overhead_s": round((table["code_cached"]["to_first_line_s"] or 0.0) - baseline, 3),
        "cold_overhead_s": round((table["code_cold"]["to_first_line_s"] or 0.0) - baseline, 3),
        "setup_cached_overhead_s": round((table["setup_cached"]["to_first_line_s"] or 0.0) - baseline, 3),
        "baseline_to_first_line_s": baseline,
        "image_cached_overhead_s": _minus(table.get("image_cached"), baseline),
        "image_cold_overhead_s": _minus(table.get("image_cold"), baseline),
        "image_cold_pull_s": (table.get("image_cold") or {}).get("pull_image_s"),
        "image": image_note,
        "cached_fetch_code_s": table["code_cached"]["fetch_code_s"],  # the phase itself, on the node
        "cold_fetch_code_s": table["code_cold"]["fetch_code_s"],
        "note": "differences below ~0.2 s are within this machine's noise (a shared 2-core host)",
        "code_mb": mb, "reps": reps,
    }
    print(f"{'case':<14}{'to first line s':>17}{'fetch code s':>14}{'pull image s':>14}{'setup s':>10}")
    for case, r in table.items():
        cells = [f"{v:.3f}" if v is not None else "-" for v in r.values()]
        print(f"{case:<14}{cells[0]:>17}{cells[1]:>14}{cells[2]:>14}{cells[3]:>10}")
    print("summary:", json.dumps(summary))
    result = {
        "summary": summary, "medians": table, "runs": rows,
        "assumptions": {
            "store": "a local folder (file://): a cold fetch pays no network transfer",
            "code": f"{mb} MB of random bytes in 4 files plus the job script (no compression gain)",
            "image": image_note + "; no Python inside: the job's interpreter mounted read-only",
            "ranks": "one rank per attempt, on the machine running the broker",
            "machine": "2 cores shared with other work",
            "setup": "`echo; sleep 0.2`: its own time is 0.2 s",
            "user": "ranks run as the broker's user (ONEPOOL_RUN_AS=root when root): no chown of the copy",
        },
    }
    dest = ROOT / "bench" / "results" / "restart.json"
    dest.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {dest.relative_to(ROOT)}")


def _minus(row: dict[str, float | None] | None, baseline: float) -> float | None:
    got = (row or {}).get("to_first_line_s")
    return None if got is None else round(got - baseline, 3)


if __name__ == "__main__":
    main()
