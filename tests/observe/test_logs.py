"""`--log-format json`: one JSON object a line, with job, attempt and node where they apply;
checked on records and on a real `onepool broker --once` process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.errors import SpecError
from broker.observe.logs import JsonFormatter, context, setup
from broker.spec import parse_config
from tests.conftest import config, kill_leftovers, train


def record(msg: str, extra: dict, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            info = sys.exc_info()
    r = logging.LogRecord("onepool.test", logging.WARNING, __file__, 1, msg, (), info)
    r.__dict__.update(extra)
    return r


@pytest.mark.parametrize(("extra", "exc", "fields"), [
    ({}, False, {}),
    (context(job=7), False, {"job": 7}),
    (context(job=7, attempt=12, node="gpu-box-0"), False, {"job": 7, "attempt": 12, "node": "gpu-box-0"}),
    (context(attempt=3), True, {"attempt": 3}),
])
def test_a_record_is_one_json_object_with_its_context(extra: dict, exc: bool, fields: dict):
    line = JsonFormatter().format(record("job 7: started", extra, exc))
    assert "\n" not in line
    got = json.loads(line)
    assert {k: got[k] for k in ("level", "logger", "message")} == {
        "level": "warning", "logger": "onepool.test", "message": "job 7: started"}
    assert got["time"].endswith("+00:00")
    assert {k: got[k] for k in ("job", "attempt", "node") if k in got} == fields
    assert ("exception" in got) is exc and ("boom" in got.get("exception", "boom"))


def test_an_unknown_format_names_the_option_and_the_allowed_values():
    with pytest.raises(SpecError, match=r"--log-format: must be one of text, json \(got 'xml'\)"):
        setup("xml")


@pytest.mark.e2e
def test_onepool_broker_logs_json_lines_naming_the_job(tmp_path: Path):
    home = tmp_path / "home"
    c = Client(home, clock=FakeClock())
    c.apply(parse_config(config()))
    j = c.submit(name="probe", team="research", command=train(2), gpus_per_node=1).id
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")},
           "ONEPOOL_HOME": str(home)}
    try:
        r = subprocess.run([sys.executable, "-m", "broker.client.cli", "broker", "--once",
                            "--log-format", "json"], env=env, capture_output=True, text=True, timeout=120)
    finally:
        kill_leftovers(home / "runs")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stderr.splitlines() if x.strip()]
    assert lines and all({"time", "level", "logger", "message"} <= set(x) for x in lines)
    started = [x for x in lines if x["message"] == f"job {j}: started"]
    assert started and started[0]["job"] == j
