"""Rebalancing estimates corrected by what past moves realized (issue 31). Pure.

A move's expected saving (broker.policy.rebalance, .defrag) rests on assumptions that past
moves can check: that the job runs as long as estimated in the cheaper pool, that the
GPUs it leaves stop costing (a rented node is billed whole: it only stops costing once all
its jobs are gone and it is given back), that the capacity it takes would otherwise have
stayed idle, and for a defragmenting move, that the gang then starts and its avoided wait
is worth `wait_value_usd_per_gpu_hour`. What each finished move realized is recorded
(rebalance_realized events in the live broker, the replay's own tally in the simulator),
and the next decisions scale their expected saving by what past moves of the same kind
realized:

    ratio(kind)  = (sum realized + PRIOR_MOVES x typical) / (sum expected + PRIOR_MOVES x typical)
                   clamped to [0, 1]; typical = the mean expected saving of those moves
    kinds        "move" (to other capacity) and "defrag" (for a waiting gang)
    a move pays  when saving x ratio - cost >= min_saving_usd and saving x ratio > cost

With no history the ratio is 1 (the estimate is taken as it is); PRIOR_MOVES pseudo-moves
that realized in full keep a few unlucky moves from stopping rebalancing at once, and a
long record dominates them. The ratio never exceeds 1: moves that realized more than
expected do not license moves the estimate alone would not make.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PRIOR_MOVES = 5.0
KINDS = ("move", "defrag")


@dataclass(frozen=True, slots=True)
class PastMove:
    """A finished move: its kind, the gross saving expected when it was decided, and the
    gross saving it realized (before the move's own cost, which both sides pay alike)."""

    kind: str
    expected_saving_usd: float
    realized_saving_usd: float


def kind_of(from_pool: str, to_pool: str) -> str:
    """"defrag" for a move within its pool (for a gang), else "move"."""
    return "defrag" if from_pool == to_pool else "move"


def realization(past: Iterable[PastMove], kind: str, prior_moves: float = PRIOR_MOVES) -> float:
    """What moves of `kind` realized per dollar expected, shrunk toward 1 by `prior_moves`
    pseudo-moves, in [0, 1] (see the module docstring). Moves expected to save nothing are
    not counted."""
    exp = real = 0.0
    n = 0
    for m in past:
        if m.kind != kind or m.expected_saving_usd <= 0:
            continue
        exp += m.expected_saving_usd
        real += m.realized_saving_usd
        n += 1
    if n == 0:
        return 1.0
    typical = exp / n
    ratio = (real + prior_moves * typical) / (exp + prior_moves * typical)
    return min(1.0, max(0.0, ratio))


def pays(saving_usd: float, cost_usd: float, ratio: float, min_saving_usd: float) -> bool:
    """Whether a move expected to save `saving_usd` for `cost_usd` pays once its saving is
    corrected by `ratio` (see the module docstring)."""
    corrected = saving_usd * ratio
    return corrected > cost_usd and corrected - cost_usd >= min_saving_usd
