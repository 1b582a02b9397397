"""Warm nodes first (issue 26): among nodes that fit a job equally well, those already holding
what it needs to start (its code snapshot; its image, once nodes report images) come first, so
a resume skips the download. A pure rule: it only reorders nodes the best fit found equal, so it
never changes how many jobs fit or which pool they go to."""

from __future__ import annotations

from collections.abc import Collection, Iterable


def warm_first(nodes: Iterable[str], warm: Collection[str]) -> list[str]:
    """`nodes` (equally good for the job, in the pool's order) with those in `warm` first; each
    group keeps its order."""
    ordered = list(nodes)
    if not warm:
        return ordered
    return [n for n in ordered if n in warm] + [n for n in ordered if n not in warm]


def warm_nodes(code: str | None, held: dict[str, frozenset[str]]) -> frozenset[str]:
    """The nodes whose agents report holding the snapshot `code` (a sha256; None: no snapshot)."""
    if code is None:
        return frozenset()
    return frozenset(node for node, digests in held.items() if code in digests)
