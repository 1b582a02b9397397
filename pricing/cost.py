"""Effective cost of capacity: the price plus the expected cost of redoing interrupted work.

Pure functions, no IO. Prices are USD per GPU-hour.

Rework model: interruptions arrive at `rate_per_h` (per node-hour of running). Each one
costs the restart overhead, plus the work since the last checkpoint for jobs that do not
checkpoint on the interruption notice; without such a checkpoint, that work is on average
half a checkpoint interval. With `on_notice` the share of jobs that do (True: all, False:
none), the expected rework per hour of running is

    rework_h = rate_per_h * (restart_overhead_s + (1 - on_notice) * interval_s / 2) / 3600

and the effective price is price * (1 + rework_h). On-prem capacity is free for placement
(an amortized rate is only reported).
"""

from __future__ import annotations

HOURS_PER_YEAR = 8766.0  # 365.25 days


def expected_rework(rate_per_h: float, checkpoint_interval_s: float, restart_overhead_s: float,
                    checkpoint_on_notice: float = 0.0) -> float:
    """Hours of work redone per hour of running (>= 0). `checkpoint_on_notice`: the share
    (0..1) of interruptions answered by a checkpoint. Raises ValueError on negative input or a
    share outside 0..1."""
    if min(rate_per_h, checkpoint_interval_s, restart_overhead_s) < 0:
        raise ValueError("rate, checkpoint interval and restart overhead must be >= 0")
    if not 0.0 <= checkpoint_on_notice <= 1.0:
        raise ValueError("checkpoint_on_notice must be a share between 0 and 1")
    lost_s = restart_overhead_s + (1.0 - checkpoint_on_notice) * checkpoint_interval_s / 2
    return rate_per_h * lost_s / 3600.0


def effective_price(price_per_gpu_h: float, rate_per_h: float, checkpoint_interval_s: float,
                    restart_overhead_s: float, checkpoint_on_notice: float = 0.0) -> float:
    """USD per GPU-hour of useful work: price x (1 + expected rework)."""
    if price_per_gpu_h < 0:
        raise ValueError("price must be >= 0")
    return price_per_gpu_h * (1.0 + expected_rework(rate_per_h, checkpoint_interval_s,
                                                     restart_overhead_s, checkpoint_on_notice))


def amortized_usd_per_gpu_hour(purchase_usd_per_node: float, years: float, gpus_per_node: int,
                               power_usd_per_gpu_hour: float = 0.0,
                               hosting_usd_per_gpu_hour: float = 0.0) -> float:
    """What one on-prem GPU-hour costs: the node's purchase price spread evenly over every hour
    of `years` (idle hours included: under-use shows up as idle cost, not as a cheaper GPU),
    split over its GPUs, plus power and hosting (space, cooling, staff) per GPU-hour.
    Raises ValueError for a non-positive lifetime or GPU count, or a negative amount."""
    if years <= 0 or gpus_per_node <= 0:
        raise ValueError("years and gpus_per_node must be > 0")
    if min(purchase_usd_per_node, power_usd_per_gpu_hour, hosting_usd_per_gpu_hour) < 0:
        raise ValueError("purchase price, power and hosting must be >= 0")
    return (purchase_usd_per_node / (years * HOURS_PER_YEAR * gpus_per_node)
            + power_usd_per_gpu_hour + hosting_usd_per_gpu_hour)
