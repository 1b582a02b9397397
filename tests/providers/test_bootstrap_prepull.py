"""A rented pool's `prepull_images` (issue 26): checked in the config, pulled in the background by
the node's boot script (providers.bootstrap) while its agent starts."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from broker.errors import SpecError
from broker.spec import parse_config
from providers.bootstrap import Boot, prepull, user_data
from tests.test_cloud_spec import cfg


@pytest.mark.parametrize(("pool", "needle"), [
    ({"prepull_images": ["Not An Image"]},
     "pools.0.prepull_images: prepull_images[0]: 'Not An Image' is not an OCI image reference"),
    ({"prepull_images": ["ok:1", "ghcr.io/x;rm -rf /"]}, "prepull_images[1]"),
    ({"prepull_images": [f"img{i}:1" for i in range(17)]}, "at most 16 items"),
    ({"prepull_images": "python:3.11"}, "valid list"),
    ({"provider": "local", "max_nodes": None, "nodes": 1, "market": "onprem", "prepull_images": ["a:1"]},
     "prepull_images: only a rented pool"),
    ({"provider": "agent", "max_nodes": None, "nodes": 1, "market": "onprem", "prepull_images": ["a:1"]},
     "pull images on agent nodes yourself"),
])
def test_bad_prepull_images_say_what_to_fix(pool: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_config(cfg(**pool))
    assert needle in str(e.value), str(e.value)


def test_a_rented_pool_takes_prepull_images() -> None:
    [p] = parse_config(cfg(prepull_images=["ghcr.io/lab/train:3"], container_runtime="docker")).pools
    assert p.prepull_images == ["ghcr.io/lab/train:3"]


BOOT = {"server_url": "http://s:8421", "join_token": "opj_x", "node_id": "n-0", "pool": "p",
        "provider": "aws", "gpus": 8, "gpu_type": "A100"}


@pytest.mark.parametrize(("images", "runtime", "present", "absent"), [
    ((), None, [], ["pre-pull", "pull"]),
    (("ghcr.io/lab/train:3",), None, ["for c in podman docker;", "pull ghcr.io/lab/train:3 >/dev/null",
                                      "prepull.log\" 2>&1 &"], []),
    (("a:1", "b:2"), "docker", ["for c in docker;", "pull a:1", "pull b:2"], ["podman"]),
])
def test_the_boot_script_pulls_the_pools_images_in_the_background(
        images: tuple[str, ...], runtime: str | None, present: list[str], absent: list[str]) -> None:
    script = user_data(Boot(**BOOT, prepull_images=images, container_runtime=runtime))
    for text in present:
        assert text in script
    for text in absent:
        assert text not in script
    assert script.index("mkdir -p") < script.index("exec onepool agent")  # (before the agent: beside it)
    if images:
        assert script.index("prepull.log") < script.index("exec onepool agent")


def test_the_prepull_lines_run_and_log_each_pull(tmp_path: Path) -> None:
    """The generated lines under bash, with a runtime on PATH that pulls one image and refuses another."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman").write_text('#!/bin/sh\necho "$@" >> "$CALLS"\n'
                                    '[ "$2" = good:1 ] || { echo nope >&2; exit 1; }\n')
    (bin_dir / "podman").chmod(0o755)
    home = tmp_path / "agent"
    home.mkdir()
    lines = prepull(("good:1", "bad:2"), None)
    r = subprocess.run(["/bin/bash", "-c", f"set -euo pipefail\n{lines}wait\n"], capture_output=True,
                       text=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "ONEPOOL_AGENT_HOME": str(home),
                            "CALLS": str(tmp_path / "calls")}, timeout=30)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "calls").read_text() == "pull good:1\npull bad:2\n"
    log = (home / "prepull.log").read_text()
    assert "pulled good:1" in log and "could not pull bad:2" in log and "nope" in log
    none = subprocess.run(["/bin/bash", "-c", f"{lines}wait\n"], capture_output=True, text=True,
                          env={"PATH": str(tmp_path / "empty"), "ONEPOOL_AGENT_HOME": str(home)}, timeout=30)
    assert none.returncode == 0 and "no container runtime" in none.stderr
