"""What a node's container runtime holds (providers.image_pull.HeldImages), reported by its
agent and preferred by the policy among equal nodes (broker.policy.warm): the listing is parsed,
asked at most once per period, and lands in the pending job's warm nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.control.snapshots import code_held
from broker.policy.warm import warm_nodes
from broker.state.model_access import NodeAgent
from providers.image_pull import MAX_REPORTED, HeldImages, parse_images

DIGEST = "d" * 64
PY = "docker.io/library/python:3.11"


@pytest.mark.parametrize("text, refs", [
    ("", []),
    ("ghcr.io/lab/train:3 ghcr.io/lab/train@sha256:ab\n",
     ["ghcr.io/lab/train:3", "ghcr.io/lab/train@sha256:ab"]),
    ("<none>:<none> <none>@<none>\nx.io/a:1 x.io/a@<none>\n", ["x.io/a:1"]),  # dangling, no digest
    ("x.io/a:1 x.io/a@sha256:1\nx.io/a:1 x.io/a@sha256:1\n", ["x.io/a:1", "x.io/a@sha256:1"]),  # once each
    ("x.io/" + "a" * 600 + ":1\n", []),  # longer than a sync may carry
])
def test_a_runtimes_listing_is_parsed(text: str, refs: list[str]) -> None:
    assert parse_images(text) == refs


def test_at_most_max_reported() -> None:
    assert len(parse_images("".join(f"x.io/i{n}:1\n" for n in range(MAX_REPORTED + 5)))) == MAX_REPORTED


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_runtime_is_asked_at_most_once_per_period(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    cli = tmp_path / "runtime"
    cli.write_text(f"#!/bin/sh\necho x >> {calls}\n[ \"$1 $2\" = 'images --format' ] || exit 3\n"
                   f"cat {tmp_path / 'held'}\n")
    cli.chmod(0o755)
    (tmp_path / "held").write_text("ghcr.io/lab/train:3 ghcr.io/lab/train@<none>\n")
    clock = Clock()
    runtime: list[tuple[str, str, dict[str, str]] | None] = [(str(cli), "podman", {"PATH": "/usr/bin:/bin"})]
    held = HeldImages(lambda: runtime[0], every_s=60, clock=clock)
    assert held.get() == ["ghcr.io/lab/train:3"]
    (tmp_path / "held").write_text("ghcr.io/lab/eval:1 ghcr.io/lab/eval@<none>\n")
    clock.t = 59
    assert held.get() == ["ghcr.io/lab/train:3"] and calls.read_text().count("x") == 1
    clock.t = 60
    assert held.get() == ["ghcr.io/lab/eval:1"] and calls.read_text().count("x") == 2
    runtime[0] = None  # the runtime went away: nothing to report
    clock.t = 120
    assert held.get() is None


def test_agents_reports_make_the_nodes_holding_the_image_warm(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c, _ = make_cluster()
    with c.store.session() as s:
        s.add(NodeAgent(node="a-0", info={"code_held": [DIGEST]}))
        s.add(NodeAgent(node="a-1", info={"code_held": [DIGEST], "images_held": [PY]}))
        s.add(NodeAgent(node="a-2", info={"images_held": [PY]}))
        s.commit()
        held = code_held(s)
    assert warm_nodes(DIGEST, held, "python:3.11") == {"a-1"}
    assert warm_nodes(None, held, "python:3.11") == {"a-1", "a-2"}
    assert warm_nodes(DIGEST, held) == {"a-0", "a-1"}
