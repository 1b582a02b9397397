"""Trace replay: a simulated clock and simulated pools around the SAME broker.policy.plan()."""
