"""Checkpoint intervals from measured costs (issue 31), live side: what broker.control.intervals
reads from real SQL rows, the save time the runtime writes into a manifest, and the status lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from broker.checkpoint.checkpoints import CheckpointStore
from broker.checkpoint.manifest import Manifest
from broker.client.cli_intervals import interval_lines
from broker.client.sdk import Client
from broker.control import intervals
from broker.policy.intervals import PRIOR_HOURS, Advice
from broker.spec import parse_config
from broker.state.model import Attempt, Checkpoint, Job
from broker.wire import JobInfo
from tests.conftest import config

POOLS = [{"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1},
         {"name": "t4", "gpu_type": "T4", "gpus_per_node": 2, "nodes": 1}]
NOW = 1_000_000.0


@pytest.fixture
def home(tmp_path: Path, clock) -> Client:  # type: ignore[no-untyped-def]
    c = Client(tmp_path / "home", clock=clock)
    c.apply(parse_config(config(pools=POOLS)))
    return c


def job(**kw: Any) -> Job:
    d: dict[str, Any] = dict(name="j", team="research", experiment="e", command=["x"], submit_time=0.0,
                             queued_at=0.0, priority="low")
    return Job(**{**d, **kw})


def attempt(job_id: int, pool: str, start: float, end: float | None, reason: str | None,
            priority: str = "low") -> Attempt:
    return Attempt(job_id=job_id, number=1, pool=pool, priority=priority, started_at=start, ended_at=end,
                   end_reason=reason, alloc=[])


def ckpt(job_id: int, step: int, save_s: float | None, copied: str | None = None) -> Checkpoint:
    return Checkpoint(job_id=job_id, step=step, uri=f"u{step}", observed_at=float(step), save_s=save_s,
                      copied_from=copied)


# Every row below belongs to job 1 (team research, experiment e, class low) unless it says so.
CASES = [
    ("nothing measured", {}, [], [], dict(save_s=None, run_s=0.0, stops=0)),
    ("median of own saves; copies and unmeasured ones skipped", {},
     [], [(1, 1, 2.0, None), (1, 2, 4.0, None), (1, 3, 30.0, None), (1, 4, 99.0, "elsewhere"),
          (1, 5, None, None)],
     dict(save_s=4.0)),
    ("another experiment's saves do not count", {"experiment": "other"}, [], [(1, 1, 7.0, None)],
     dict(save_s=None)),
    ("stops: preempted, interrupted, lost; completed and failed are run time only", {},
     [("a100", NOW - 3600, NOW - 2600, "PREEMPTED"), ("a100", NOW - 2600, NOW - 1600, "INTERRUPTED"),
      ("a100", NOW - 1600, NOW - 600, "LOST"), ("a100", NOW - 600, NOW - 100, "COMPLETED"),
      ("a100", NOW - 100, NOW, "FAILED")], [],
     dict(run_s=3600.0, stops=3)),
    ("a running attempt counts up to now", {}, [("a100", NOW - 500, None, None)], [], dict(run_s=500.0)),
    ("another class's attempts do not count", {"priority": "high"},
     [("a100", NOW - 3600, NOW, "PREEMPTED")], [], dict(run_s=0.0, stops=0)),
    ("pools of a GPU type it does not take do not count", {"gpu_types": ["T4"]},
     [("a100", NOW - 3600, NOW, "PREEMPTED"), ("t4", NOW - 100, NOW, "PREEMPTED")], [],
     dict(run_s=100.0, stops=1, prior_rate_per_h=0.5)),
    ("older than the window: forgotten", {}, [("a100", NOW - intervals.RATE_WINDOW_S - 10, NOW, "LOST")], [],
     dict(run_s=0.0, stops=0)),
]


@pytest.mark.parametrize(("name", "jobkw", "atts", "ckpts", "expect"), CASES, ids=[c[0] for c in CASES])
def test_facts_from_rows(home: Client, name: str, jobkw: dict, atts: list, ckpts: list, expect: dict) -> None:
    with home.store.session() as s:
        measured = job()
        s.add(measured)
        s.flush()
        for pool, start, end, reason in atts:
            s.add(attempt(measured.id or 0, pool, start, end, reason))
        for jid, step, save, copied in ckpts:
            s.add(ckpt(jid, step, save, copied))
        asked = job(**jobkw) if jobkw else measured
        s.add(asked)
        s.commit()
        got = intervals.facts(s, home.config(), asked, intervals.CycleInputs({"a100": 0.1, "t4": 0.5}), NOW)
    want = {"save_s": None, "run_s": 0.0, "stops": 0,
            "prior_rate_per_h": 0.5 if jobkw.get("gpu_types") == ["T4"] else 0.3, **expect}
    assert {k: getattr(got, k) for k in want} == pytest.approx(want), name


def test_at_start_records_the_advice_and_auto_takes_it(home: Client) -> None:
    with home.store.session() as s:
        fixed, auto = job(checkpoint_interval_s=900.0), job(checkpoint_auto=True)
        s.add_all([fixed, auto])
        s.flush()
        s.add(attempt(fixed.id or 0, "a100", NOW - 3600 * PRIOR_HOURS, NOW, "PREEMPTED"))
        s.add(ckpt(fixed.id or 0, 1, 20.0))
        s.commit()
        inputs = intervals.CycleInputs()
        a = intervals.at_start(s, home.config(), fixed, inputs, NOW)
        b = intervals.at_start(s, home.config(), auto, inputs, NOW)
        assert list(inputs.stops) == [("low", ("a100", "t4"))]  # read once in the cycle
        assert a == b and a.basis == "measured" and a.rate_per_h == pytest.approx(1 / (2 * PRIOR_HOURS))
        assert fixed.checkpoint_interval_s == 900.0 and auto.checkpoint_interval_s == a.interval_s
        assert Advice.from_record(fixed.checkpoint_advice) == a and fixed.checkpoint_advice["at"] == NOW


def test_status_shows_the_advice_and_the_expected_loss_at_both_intervals(home: Client) -> None:
    adv = Advice(interval_s=600.0, save_s=10.0, rate_per_h=0.5, basis="measured")
    row = job(checkpoint_interval_s=1800.0, checkpoint_advice=adv.to_record(NOW))
    row.id = 1
    info = JobInfo.of(row, [], NOW)
    assert info.checkpoint_advice is not None
    assert (info.checkpoint_advice.current_saving_s_per_h, info.checkpoint_advice.current_lost_s_per_h,
            info.checkpoint_advice.advised_saving_s_per_h, info.checkpoint_advice.advised_lost_s_per_h) \
        == pytest.approx((20.0, 450.0, 60.0, 150.0))
    lines = interval_lines(info)
    assert "1800 s (fixed" in lines[0] and "advised 600 s" in lines[0] and "one per 2.0 h" in lines[0]
    assert "at 1800 s, 20 s saving + 450 s lost; at 600 s, 60 s saving + 150 s lost" in lines[1]
    assert interval_lines(JobInfo.of(job(), [], NOW)) == []  # not started: nothing advised yet


@pytest.mark.parametrize(("given", "expect"), [
    (12.5, 12.5), (0, 0.0), (-1, None), ("3", None), (float("nan"), None), (True, None), (None, None)])
def test_a_manifest_save_time_is_a_measurement_garbage_is_unknown(given: Any, expect: float | None) -> None:
    body = {"format": 1, "step": 3, "time": 5.0, "files": {}, "save_s": given}
    m = Manifest.from_json(json.dumps(body), "u")
    assert m.save_s == expect and not m.problems


def test_a_save_records_how_long_it_took(tmp_path: Path) -> None:
    st = CheckpointStore(f"file://{tmp_path}/ck")
    m = st.write(1, {"x": b"abc"}, now=110.0, started=100.0)
    assert m.save_s == 10.0 and st.manifest(1).save_s == 10.0  # type: ignore[union-attr]
    assert st.write(2, {"x": b"abc"}, now=110.0).save_s is None
