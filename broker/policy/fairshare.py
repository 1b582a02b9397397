"""Decayed usage for fair share: GPU-seconds weighted by 2^(-age / half_life). Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable


def decayed_gpu_seconds(
    intervals: Iterable[tuple[float, float, int]], now: float, half_life_s: float
) -> float:
    """Sum over (start, end, gpus) of gpus * integral of 2^(-(now - t)/H) dt on [start, end].

    An interval still running passes end=now. Intervals in the future count nothing.
    Raises ValueError for a non-positive half life.
    """
    if half_life_s <= 0:
        raise ValueError("half_life_s must be > 0")
    k = math.log(2) / half_life_s
    total = 0.0
    for start, end, gpus in intervals:
        end = min(end, now)
        if end <= start:
            continue
        total += gpus * (math.exp(-k * (now - end)) - math.exp(-k * (now - start))) / k
    return total


def decay(usage: float, gpus: int, dt: float, half_life_s: float) -> float:
    """Decayed GPU-seconds `dt` seconds later, with `gpus` GPUs in use all along (the closed
    form of decayed_gpu_seconds over a stretch where nothing changes). Raises ValueError for
    a non-positive half life."""
    if half_life_s <= 0:
        raise ValueError("half_life_s must be > 0")
    if dt <= 0:
        return usage
    k = math.log(2) / half_life_s
    f = math.exp(-k * dt)
    return usage * f + gpus * (1 - f) / k
