"""Restart phases (broker.phases): what a node may report is cleaned, and the line status shows."""

from __future__ import annotations

from typing import Any

import pytest

from broker.phases import clean, describe


@pytest.mark.parametrize("raw, kept", [
    ({"fetch_code_s": 0.1234, "setup_s": 2, "setup_cached": True}, {"fetch_code_s": 0.123, "setup_s": 2.0,
                                                                    "setup_cached": True}),
    ({"fetch_code_s": -1, "setup_s": float("nan"), "fetch_data_s": 1e12}, {}),  # out of range
    ({"fetch_code_s": True, "setup_cached": "yes", "pending": 1}, {}),  # wrong types
    ({"rm -rf": 1.0, "first_progress_s": 3.0, "restore_copy_s": 1.0}, {}),  # not a node's to say
    ("not a dict", {}),
    ({"pull_image_s": 5.5, "pending": True}, {"pull_image_s": 5.5, "pending": True}),
])
def test_a_nodes_report_keeps_known_phases_with_sane_values(raw: Any, kept: dict[str, Any]) -> None:
    assert clean(raw) == kept


@pytest.mark.parametrize("phases, first, line", [
    ({"fetch_code_s": 0.5, "setup_s": 0.01, "setup_cached": True, "fetch_data_s": 1.0}, 4.0,
     "fetch code 0.50 s, setup 0.01 s (cached), fetch data 1.00 s, first progress 4.00 s"),
    ({"fetch_code_s": 0.5, "pending": True}, None, "fetch code 0.50 s, setup still running"),
    ({}, 2.5, "first progress 2.50 s"),
])
def test_the_status_line_lists_phases_in_restart_order(phases: dict[str, Any], first: float | None,
                                                      line: str) -> None:
    assert describe(phases, first) == line
