"""Restart phases (broker.phases): what a node may report is cleaned, and the line status shows."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from broker.phases import clean, describe
from providers.rank_prep import AWAITS, PHASES_FILE, read_phases


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
    ({"fetch_code_s": 0.5, "pending": True}, None, "fetch code 0.50 s, image or setup still in progress"),
    ({"fetch_code_s": 0.1, "pull_image_s": 2.5, "setup_s": 1, "setup_cached": False}, 5.0,
     "fetch code 0.10 s, pull image 2.50 s, setup 1.00 s, first progress 5.00 s"),
    ({}, 2.5, "first progress 2.50 s"),
])
def test_the_status_line_lists_phases_in_restart_order(phases: dict[str, Any], first: float | None,
                                                      line: str) -> None:
    assert describe(phases, first) == line


PULLED = {"image": "img:1", "pull_image_s": 1.5, "cached": False}
SETUP_DONE = {"setup_s": 2.0, "cached": True, "digest": "d"}


@pytest.mark.parametrize("awaits, files, want", [
    (None, {}, {"fetch_code_s": 0.1}),  # nothing awaited: as written
    (["pull"], {}, {"fetch_code_s": 0.1, "pending": True}),  # its image still pulling
    (["pull"], {"run/image.json": PULLED}, {"fetch_code_s": 0.1, "pull_image_s": 1.5, "pending": False}),
    (["pull", "setup"], {"run/image.json": PULLED},
     {"fetch_code_s": 0.1, "pull_image_s": 1.5, "pending": True}),
    (["pull", "setup"], {"run/image.json": PULLED, "run/setup.json": SETUP_DONE},  # an image's setup
     {"fetch_code_s": 0.1, "pull_image_s": 1.5, "setup_s": 2.0, "setup_cached": True, "pending": False}),
    (["setup"], {"job/setup.json": SETUP_DONE},  # the host's setup runner, in the job's folder
     {"fetch_code_s": 0.1, "setup_s": 2.0, "setup_cached": True, "pending": False}),
    (["setup"], {"job/setup.json": "not json"}, {"fetch_code_s": 0.1, "pending": True}),
])
def test_a_ranks_phases_stay_pending_until_its_pull_and_setup_are_recorded(
        tmp_path: Path, awaits: list[str] | None, files: dict[str, Any], want: dict[str, Any]) -> None:
    run, job = tmp_path / "run", tmp_path / "job"
    run.mkdir()
    job.mkdir()
    written: dict[str, Any] = {"fetch_code_s": 0.1, **({"pending": True, AWAITS: awaits} if awaits else {})}
    (run / PHASES_FILE).write_text(json.dumps(written))
    for name, body in files.items():
        (tmp_path / name).write_text(body if isinstance(body, str) else json.dumps(body))
    assert read_phases(run, job) == want


@pytest.mark.parametrize("plant", ["fifo", "link", "huge"])
def test_a_hostile_setup_record_in_the_jobs_folder_is_refused_without_waiting(tmp_path: Path,
                                                                              plant: str) -> None:
    """The job's folder is the job's: a FIFO (a read would wait for a writer without end), a link
    to another file, or a record padded past its size bound is no setup time."""
    run, job = tmp_path / "run", tmp_path / "job"
    run.mkdir()
    job.mkdir()
    (run / PHASES_FILE).write_text(json.dumps({"fetch_code_s": 0.1, "pending": True, AWAITS: ["setup"]}))
    target = job / "setup.json"
    if plant == "fifo":
        os.mkfifo(target)
    elif plant == "link":
        (tmp_path / "elsewhere.json").write_text(json.dumps(SETUP_DONE))
        target.symlink_to(tmp_path / "elsewhere.json")
    else:
        target.write_text(json.dumps({**SETUP_DONE, "pad": "x" * 10_000}))
    assert read_phases(run, job) == {"fetch_code_s": 0.1, "pending": True}
