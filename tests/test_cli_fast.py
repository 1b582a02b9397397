"""Issue 27, part 3: `onepool submit`, `status`, `cancel` and `events` over HTTP start fast. They run
through broker.client.cli_fast (argparse, the server's JSON as it is) and must import nothing
heavy (typer, pydantic, the SDK's models, the server), print exactly what the typer app
prints, and leave to the app every command line they do not take as it would."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client.cli_fast import PARSERS, fast_command
from broker.wire_views import ATTEMPT_FIELDS, EVENT_FIELDS, HEALTH_FIELDS, JOB_FIELDS, JobView, OldServer

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("typer", "click", "pydantic", "pydantic_core", "broker.wire", "broker.spec", "broker.sdk",
         "broker.client.cli_app", "broker.client.http", "broker.state", "sqlalchemy", "sqlmodel", "yaml")
RUN = """
import sys
sys.argv = ["onepool", *sys.argv[1:]]
from broker.client.{module} import main
try:
    main()
finally:
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r} or m in {heavy!r})
    sys.stderr.write(f"\\nheavy: {{heavy}}\\n")
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Any]]:
    """A seeded home (on a fake clock: the answers do not change between runs) served by the
    real API in a thread; the environment of a command over HTTP with an admin token."""
    from broker.api.app import create_app
    from tests.agents.harness import serve
    from tests.dashboard.seed import seed

    home = seed(tmp_path_factory.mktemp("fast") / "home")
    api = serve(create_app(home.store, home.clock))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}
    token = home.create_token("prod", "admin").token
    env.update(PYTHONPATH=str(ROOT), ONEPOOL_URL=api.url, ONEPOOL_TOKEN=token, COLUMNS="200")
    yield env, home
    api.stop()


def onepool(env: dict[str, str], args: list[str], module: str = "cli") -> tuple[str, str, list[str]]:
    """(stdout, stderr without the last line, the heavy modules loaded) of one `onepool` process."""
    code = RUN.format(module=module, heavy=HEAVY)
    p = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=60, check=False)
    err, _, last = p.stderr.rstrip("\n").rpartition("\n")
    assert last.startswith("heavy: "), p.stderr
    assert p.returncode == 0, p.stderr
    return p.stdout, err, ast.literal_eval(last.removeprefix("heavy: "))


def same_job(out: str) -> str:
    """A submit's or cancel's output with its job's id and times masked."""
    [job] = re.findall(r'^submitted job (\d+)|^job (\d+) cancelled|^  "id": (\d+)', out, re.M)
    out = re.sub(rf"\b{''.join(job)}\b", "ID", out)
    return re.sub(r'"(submit_time|wait_s|end_time)": [0-9.]+', "TIME", out)


# one process each way per case (the JSON of jobs: status --json; submit --json prints the same type)
FAST_RUNS = [["status"], ["status", "--json", "--limit", "2", "--state", "succeeded"], ["status", "1"],
             ["--home", "unused", "submit", "--name", "probe", "--team", "research", "--gpus", "2", "--env",
              "A=1", "--", "python", "-c", "pass"],
             ["events", "1"], ["cancel", "NEW"]]


@pytest.mark.parametrize("args", FAST_RUNS, ids=[" ".join(a) for a in FAST_RUNS])
def test_the_fast_path_loads_nothing_heavy_and_prints_what_the_app_prints(
        site: tuple[dict[str, str], Any], args: list[str]) -> None:
    env, home = site

    def job(a: str) -> str:  # NEW: a pending job of its own
        return str(home.submit(name="victim", team="prod", command=["true"]).id) if a == "NEW" else a

    out, err, heavy = onepool(env, [job(a) for a in args])
    assert heavy == []
    app_out, app_err, app_heavy = onepool(env, [job(a) for a in args], module="cli_app")  # as before
    assert "typer" in app_heavy and "pydantic" in app_heavy  # what the fast path saves
    if {"submit", "cancel"} & set(args):  # each makes or ends a job of its own: ids and times differ
        out, app_out = (same_job(o) for o in (out, app_out))
    assert (out, err) == (app_out, app_err)
    assert out


# (command line, whether the fast path runs it; else the typer app does)
ROUTES: list[tuple[list[str], bool]] = [
    (["status"], True),
    (["--home", "h", "status", "7", "--json"], True),
    (["--home=h", "status", "--team", "t", "--status", "pending", "--state", "running"], True),
    (["submit", "--name", "x", "--", "python", "train.py", "--help"], True),  # the job's --help
    (["submit", "-f", "job.yaml", "--gpu-type", "A100", "--gpu-type", "L4"], True),
    (["pools"], False),
    ([], False),
    (["status", "--help"], False),
    (["status", "-h"], False),
    (["status", "--array", "3"], False),
    (["status", "--estimate"], False),
    (["status", "--limit", "0"], False),  # the app says which range
    (["status", "--limit", "x"], False),
    (["status", "--lim", "3"], False),  # no abbreviations: click takes none
    (["status", "1", "2"], False),
    (["submit", "--dry-run", "--name", "x", "--", "true"], False),
    (["submit", "--name", "x", "python", "--", "true"], False),  # a command before --
    (["submit", "--gpus", "two", "--", "true"], False),
    (["submit", "--name"], False),
    (["--home", "h"], False),
    (["cancel", "4"], True),
    (["cancel", "4", "--array"], False),
    (["cancel"], False),
    (["events"], True),
    (["events", "4", "--json"], True),
    (["events", "--", "4"], False),
    (["status", "-1"], False),  # click reads it as an option
    (["submit", "--budget-usd", "-5", "--", "true"], False),
    (["submit", "--name", "x", "--", "sleep", "-1"], True),  # the job's own argument
]


@pytest.mark.parametrize(("argv", "fast"), ROUTES, ids=[" ".join(a) or "(none)" for a, _ in ROUTES])
def test_the_fast_path_takes_only_what_it_runs_as_the_app_would(monkeypatch: pytest.MonkeyPatch,
                                                                  argv: list[str], fast: bool) -> None:
    monkeypatch.setenv("ONEPOOL_URL", "http://127.0.0.1:9")
    assert (fast_command(argv) is not None) is fast
    monkeypatch.delenv("ONEPOOL_URL")
    assert fast_command(argv) is None  # a home on this machine: the app (and its fast reader)


# (command, the app's options the fast path leaves to the app)
LEFT_TO_THE_APP = [("submit", {"--dry-run"}), ("status", {"--array", "--estimate"}), ("cancel", {"--array"}),
                   ("events", set())]


@pytest.mark.parametrize(("command", "left"), LEFT_TO_THE_APP)
def test_the_fast_parsers_take_the_apps_options(command: str, left: set[str]) -> None:
    assert {c for c, _ in LEFT_TO_THE_APP} == set(PARSERS)  # every fast command is compared
    import typer.main

    from broker.client.cli_app import app

    params = typer.main.get_command(app).commands[command].params  # type: ignore[attr-defined]
    app_opts = {o for p in params for o in p.opts if o.startswith("-")} - {"--help"}
    assert set(PARSERS[command]()._option_string_actions) == app_opts - left


# (view fields, the broker.wire model they must be fields of)
VIEWS = [(JOB_FIELDS, "JobInfo"), (ATTEMPT_FIELDS, "AttemptInfo"), (HEALTH_FIELDS, "Health"),
         (EVENT_FIELDS, "EventInfo")]


@pytest.mark.parametrize(("fields", "model"), VIEWS, ids=[m for _, m in VIEWS])
def test_the_views_read_fields_of_the_wire_models(fields: tuple[str, ...], model: str) -> None:
    import broker.wire

    assert set(fields) <= set(getattr(broker.wire, model).model_fields)


BAD_ANSWERS: list[tuple[Any, str]] = [
    ([], "a list where a job was expected"),
    ({"id": 1}, "job lacks name, team"),
    ({**dict.fromkeys(JOB_FIELDS), "attempt_list": [{"number": 1}]}, "attempt lacks pool"),
]


@pytest.mark.parametrize(("answer", "says"), BAD_ANSWERS, ids=["not-a-dict", "no-fields", "bad-attempt"])
def test_a_view_names_what_an_older_server_did_not_send(answer: Any, says: str) -> None:
    with pytest.raises(OldServer, match=says):
        JobView(answer)
