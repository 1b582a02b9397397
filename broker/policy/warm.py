"""Warm nodes first (issue 26): among nodes that fit a job equally well, those already holding
what it needs to start (its code snapshot, its container image) come first, so a resume skips
the download. A pure rule: it only reorders nodes the best fit found equal, so it never changes
how many jobs fit or which pool they go to.

What a node holds is what its agent last reported: code digests and image references, in one
set per node. An image is matched by its normalized reference (`image_ref`: the registry and
`library/` Docker adds, `:latest` when no tag), as runtimes list them."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

DEFAULT_REGISTRY = "docker.io"


def warm_first(nodes: Iterable[str], warm: Collection[str]) -> list[str]:
    """`nodes` (equally good for the job, in the pool's order) with those in `warm` first; each
    group keeps its order."""
    ordered = list(nodes)
    if not warm:
        return ordered
    return [n for n in ordered if n in warm] + [n for n in ordered if n not in warm]


def image_ref(image: str) -> str:
    """An image reference as a runtime lists it: `python:3.11` -> `docker.io/library/python:3.11`,
    `ghcr.io/lab/train` -> `ghcr.io/lab/train:latest`; a digest (`@sha256:...`) kept."""
    name, at, digest = image.partition("@")
    first, _, rest = name.partition("/")
    if not rest:
        name = f"{DEFAULT_REGISTRY}/library/{name}"
    elif not ("." in first or ":" in first or first == "localhost"):
        name = f"{DEFAULT_REGISTRY}/{name}"
    if not at and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name + at + digest


def warm_nodes(code: str | None, held: Mapping[str, frozenset[str]],
               image: str | None = None) -> frozenset[str]:
    """The nodes holding the most of what the job needs: its snapshot `code` (a sha256; None: no
    snapshot) and its `image` (None: no image), from what their agents report (`held`: digests
    and normalized image references per node). Nodes holding both beat those holding one; none
    when no node holds any."""
    wants = [w for w in (code, None if image is None else image_ref(image)) if w is not None]
    if not wants:
        return frozenset()
    score = {node: sum(w in got for w in wants) for node, got in held.items()}
    best = max(score.values(), default=0)
    return frozenset(n for n, k in score.items() if k == best) if best else frozenset()
