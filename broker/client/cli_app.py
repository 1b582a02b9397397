"""`onepool ...`: the command line. Every command that prints takes --json.

Errors the user can fix (bad input, unknown job, nothing configured) print one clear
message and exit with status 2; anything else is a bug and shows its traceback.

Each command imports what it needs when it runs (the database layer alone takes longer to
import than `onepool status` may take): this module imports only typer at the top, and
`status` reads a local SQLite home through broker.client.reader when it can
(bench/cli_speed.py measures it). `onepool` itself enters through broker.client.cli, which runs
`submit` and `status` over HTTP without this module (broker.client.cli_fast) and everything
else here; new commands register here, as cli_money's do.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.client.cli_jobs import (
    STATUS_LIMIT,
    cancel_and_print,
    show_events,
    show_job,
    show_jobs,
    submit_and_print,
    submit_data,
)
from broker.client.cli_out import (  # noqa: F401  (out, err: tests may replace them in cli_out)
    _ago,
    _err,
    _esc,
    _iso,
    _out,
    _print_json,
    _table,
    _ts,
    _warn_if_down,
    jobs_table,
    reporting_errors,
)
from broker.errors import SpecError

if TYPE_CHECKING:
    from broker.client.sdk import Client

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="onepool: one priority queue over every GPU you can reach.")
_state: dict[str, Any] = {}

HomeOpt = Annotated[Path | None, typer.Option("--home", envvar="ONEPOOL_HOME", metavar="DIR",
                                              help="broker home (default ./.onepool)")]
from broker.client.cli_run import JsonOpt  # noqa: E402  (one --json option for every command)

NAME_RULE = "lowercase letters, digits, '_', '.', '-' (1-63 chars, starting with a letter or digit)"


@app.callback()
def _root(home: HomeOpt = None) -> None:
    _state["home"] = home


def _client() -> Any:
    """The SDK client: over HTTP when ONEPOOL_URL is set, else on the home's database."""
    from broker.sdk import Client

    return Client(_state.get("home"))


def _embedded() -> Client:
    """The home's database itself (commands that run the broker, the server or the demo)."""
    from broker.sdk import embedded_client

    return embedded_client(_state.get("home"))


def _reader() -> Any:
    """Something with the SDK's read methods (`get`, `list`): the fast SQLite reader when it
    can answer exactly as the SDK would (a local home, not ONEPOOL_URL), else the SDK client."""
    import os

    if os.environ.get("ONEPOOL_URL"):
        return _client()
    from broker.client.reader import open_reader

    return open_reader(_state.get("home")) or _client()


@app.command()
def apply(config: Annotated[Path, typer.Option("-c", "--config", metavar="FILE",
                                               help="the onepool.yaml to apply")] = Path("onepool.yaml"),
          as_json: JsonOpt = False) -> None:
    """Apply an onepool.yaml: pools, teams, broker settings. Refuses checkpoints kept where a
    pool's nodes cannot reach them (broker.spec.unreachable_stores)."""
    from broker.spec import load_config, unreachable_stores

    cfg = load_config(config)
    problems = unreachable_stores(cfg)
    if problems:
        raise SpecError(str(config), problems)
    cfg = _client().apply(cfg)
    if as_json:
        _print_json(cfg.model_dump(mode="json"))
    else:
        _out().print(f"applied {config}: {len(cfg.pools)} pools, {len(cfg.teams)} teams", markup=False)


@app.command()
def submit(
    command: Annotated[list[str] | None, typer.Argument(
        metavar="-- COMMAND...", help="the command to run, after --")] = None,
    file: Annotated[Path | None, typer.Option("-f", "--file", metavar="FILE",
                                              help="a job spec YAML; flags given too win")] = None,
    name: Annotated[str | None, typer.Option(metavar="NAME", help=f"job name: {NAME_RULE}")] = None,
    team: Annotated[str | None, typer.Option(metavar="TEAM", help="a team of the config")] = None,
    experiment: Annotated[str | None, typer.Option(
        metavar="NAME", help="experiment the job belongs to (costs group by it; default 'default')")] = None,
    priority: Annotated[str | None, typer.Option(metavar="CLASS",
                                                 help="urgent|high|normal|low (default normal)")] = None,
    budget_usd: Annotated[float | None, typer.Option(
        "--budget-usd", metavar="USD", help="stop (after a checkpoint) once it has cost this much")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", metavar="N", help="GPUs per node (default 1)")] = None,
    nodes: Annotated[int | None, typer.Option(metavar="N", help="nodes, all in one pool (default 1)")] = None,
    gpu_type: Annotated[list[str] | None, typer.Option(
        "--gpu-type", metavar="TYPE", help="an acceptable GPU type (repeat for more; default any)")] = None,
    spot: Annotated[str | None, typer.Option(metavar="POLICY",
                                             help="never|allowed|only (default allowed)")] = None,
    checkpoint_interval_s: Annotated[str | None, typer.Option(
        "--checkpoint-interval-s", metavar="S|auto",
        help="how often the job checkpoints (a hint; default 1800; auto: advised by the broker)")] = None,
    deadline: Annotated[str | None, typer.Option(metavar="WHEN", help="finish by then: 2026-12-06T18:00Z "
                                                 "or 36h from now (cheap capacity while on pace)")] = None,
    image: Annotated[str | None, typer.Option(
        "--image", metavar="REF", help="an OCI image each rank runs in, e.g. ghcr.io/lab/train:3")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", metavar="KEY=VALUE",
                                                  help="an environment variable (repeat for more)")] = None,
    array: Annotated[str | None, typer.Option(
        "--array", metavar="RANGE", help="one job per index, e.g. 0-99%10 (at most 10 at once); "
                                         "each sees ONEPOOL_ARRAY_INDEX")] = None,
    after: Annotated[list[str] | None, typer.Option(
        "--after", metavar="JOB[:ok|:any|:failed]", help="start only after this job succeeded "
        "(:ok, the default), ended (:any) or failed; ARRAY[*]:COND for every element of an array, "
        "ARRAY[i]:COND for the element with the same index (repeat for more)")] = None,
    code: Annotated[str | None, typer.Option("--code", metavar="FOLDER|none|sha256:HEX|URI#sha256=HEX", help=(
        "the job's code: `.` packs this folder (git-aware, .onepoolignore) for any node"))] = None,
    setup: Annotated[list[str] | None, typer.Option("--setup", metavar="CMD", help=(
        "a command run once per node before the job (per code and setup; repeat for more)"))] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="submit nothing: print where the job would run, when it would start, "
                          "what it would cost")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Queue a job: `onepool submit --name x --team t --gpus 2 -- python train.py`. An array
    (`--array`) or a `sweep:` grid in the job YAML makes one job per element."""
    flags = {"name": name, "team": team, "experiment": experiment, "priority": priority,
             "budget_usd": budget_usd, "gpus_per_node": gpus, "nodes": nodes, "gpu_types": gpu_type,
             "spot": spot, "checkpoint_interval_s": checkpoint_interval_s, "deadline": deadline,
             "command": command or None, "array": array, "after": after, "image": image, "code": code,
             "setup": setup}
    import os

    data = submit_data(file, flags, env, over_http=bool(os.environ.get("ONEPOOL_URL")))
    c = _client()
    if dry_run:  # issue 29: the estimate, nothing written
        from broker.client.cli_estimate import summary

        est = c.estimate(data)
        if as_json:
            _print_json(est.model_dump())
        else:
            _out().print(summary(est, _ts), markup=False)
        return
    submit_and_print(c, data, as_json)


@app.command()
def status(job: Annotated[int | None, typer.Argument(metavar="[JOB]", help="one job's id")] = None,
           state: Annotated[list[str] | None, typer.Option(
               "--status", "--state", metavar="STATUS",
               help="only jobs in this state: pending|running|succeeded|failed|cancelled|"
                    "budget_exhausted (repeat for more)")] = None,
           team: Annotated[str | None, typer.Option(metavar="TEAM", help="only this team's jobs")] = None,
           all_: Annotated[bool, typer.Option("--all", help="every job, oldest first")] = False,
           limit: Annotated[int, typer.Option("--limit", min=1, max=1000, metavar="N",
                                              help="jobs on the page: the running first, then the "
                                                   "newest")] = STATUS_LIMIT,
           array: Annotated[int | None, typer.Option("--array", metavar="ARRAY",
                                                     help="only this array's elements")] = None,
           user: Annotated[str | None, typer.Option(metavar="USER", help="only the jobs USER submitted")]
           = None,
           estimate: Annotated[bool, typer.Option("--estimate", help="also when each pending job "
                                                  "(the first 50) would start, where, at what cost")] = False,
           as_json: JsonOpt = False) -> None:
    """Show jobs: a page of the running ones first, then the newest, under a line of counts per
    state (or one job with its attempts), with progress and an ETA when jobs report them."""
    c = _reader()
    if job is not None:
        show_job(c, job, as_json)
    else:
        show_jobs(c, state, team, all_, limit, array, estimate, as_json, _client, user)


@app.command()
def health(as_json: JsonOpt = False) -> None:
    """Is a broker leading and cycling? Exit status 0 if up, 1 if not."""
    h = _client().health()
    if as_json:
        _print_json(h.model_dump())
    else:
        t = _table("broker health", ["up", "leader", "fencing", "last cycle", "age s", "down since"])
        t.add_row("yes" if h.broker_up else "NO", _esc(h.leader or ""), str(h.fencing),
                  "" if h.last_cycle_at is None else _iso(h.last_cycle_at),
                  "" if h.last_cycle_age_s is None else f"{h.last_cycle_age_s:.1f}",
                  "" if h.down_since is None else _iso(h.down_since))
        _out().print(t)
        if h.servers:  # ONEPOOL_URL with several URLs: the leader's API and the standbys
            st = _table("servers", ["url", "role", "process", "error"])
            for x in h.servers:
                st.add_row(_esc(x.url), x.role, _esc(x.served_by or ""), _esc(x.error or ""))
            _out().print(st)
        _out().print(h.summary, markup=False)
    if not h.broker_up:
        raise typer.Exit(1)


@app.command()
def pools(as_json: JsonOpt = False) -> None:
    """Pools and their nodes now: free GPUs per node, who holds the rest, price, age."""
    rows = _client().pools()
    if as_json:
        _print_json([{**p.model_dump(), "free_gpus": p.free_gpus} for p in rows])
        return
    t = _table("pools and nodes", ["pool / node", "market", "GPU", "state", "GPUs", "free",
                                   "jobs holding", "USD/node-h", "USD/GPU-h", "age"],
               right=("GPUs", "free", "USD/node-h", "USD/GPU-h", "age"))
    for p in rows:
        price = ("unpriced", "") if p.usd_per_node_hour is None else (
            f"{p.usd_per_node_hour:.4f}", f"{p.usd_per_gpu_hour or 0.0:.4f}")
        cap = f"{len(p.nodes)}/{p.max_nodes} nodes" if p.max_nodes is not None else f"{len(p.nodes)} nodes"
        t.add_row(_esc(p.name), p.market, p.gpu_type, cap, str(p.gpus), str(p.free_gpus), "", *price, "")
        for n in p.nodes:
            t.add_row(f"  {_esc(n.id)}", "", "", n.state, str(n.gpus), str(n.free_gpus),
                      ", ".join(map(str, n.jobs)), "", "", _ago(n.age_s))
    _out().print(t)
    for p in rows:
        if p.unpriced:
            _err().print(f"warning: {p.unpriced}", markup=False)


@app.command()
def cancel(job: Annotated[int, typer.Argument(metavar="JOB", help="the job's id")],
           array: Annotated[bool, typer.Option("--array", help="JOB is an array: cancel every "
                                                               "element not ended")] = False,
           as_json: JsonOpt = False) -> None:
    """Cancel a job: a pending one at once; a running one gets SIGTERM and its grace period."""
    if array:
        from broker.client.cli_arrays import cancel_array

        infos = cancel_array(_client(), job)
        if as_json:
            _print_json([i.model_dump() for i in infos])
        else:
            _out().print(jobs_table(infos, f"array {job}"))
        return
    cancel_and_print(_client(), job, as_json)


@app.command()
def events(job: Annotated[int | None, typer.Argument(metavar="[JOB]", help="one job's id")] = None,
           user: Annotated[str | None, typer.Option(metavar="USER", help="only of the jobs USER "
                                                    "submitted")] = None,
           as_json: JsonOpt = False) -> None:
    """The event log (of one job, or all), with who made each happen."""
    show_events(_client(), job, as_json, user)


@app.command()
def logs(job: Annotated[int, typer.Argument(metavar="JOB", help="the job's id")],
         attempt: Annotated[int | None, typer.Option(metavar="N", help="attempt number (default: the last)")]
         = None,
         rank: Annotated[int, typer.Option(metavar="R", help="which rank of a multi-node job")] = 0,
         follow: Annotated[bool, typer.Option("-f", "--follow", help="keep printing new output "
                                              "(and the next attempts') until the job ends")] = False,
         poll_s: Annotated[float, typer.Option(
             "--poll-s", metavar="S", min=0.05, help="with -f: seconds between looks for new output")]
         = 0.5) -> None:
    """Print a job's output (its last attempt unless --attempt N); -f follows it until the job
    ends, waiting for a pending job to start and, over HTTP, for a server that stops answering
    (it continues where it was). Where output over the attempt's cap was dropped
    (broker.output_cap_bytes), a line on stderr says how many bytes."""
    from broker.client.cli_logs import Follower

    def say(text: str) -> None:
        sys.stdout.flush()
        _err().print(text, highlight=False, markup=False, soft_wrap=True)

    Follower(_client(), job, attempt, rank, say, poll_s=poll_s).run(follow)


from broker.client.cli_money import register as _register_money  # noqa: E402  (issue 6: cost, budget, dashboard)

_register_money(app, _client, _out)

from broker.client.cli_people import register as _register_people  # noqa: E402  (issue 28)

_register_people(app, _client, _out, _print_json)

from broker.client.cli_remote import register as _register_remote  # noqa: E402  (issue 9)

_register_remote(app, _client, _embedded, _out, _print_json)

from broker.client.cli_rebalance import register as _register_rebalance  # noqa: E402  (issue 12)

_register_rebalance(app, _client, _out, _print_json)

from broker.client.cli_run import register as _register_run  # noqa: E402  (broker, demo, simulate)

_register_run(app, _embedded, lambda: _state.get("home"), _out, _err, _print_json)

from broker.client.cli_replay import register as _register_replay  # noqa: E402  (issue 31)

_register_replay(app, _client, _out, _print_json)


def main() -> None:
    """Run the typer app on sys.argv, the user's errors printed as one line (cli_out.reporting_errors)."""
    import logging

    logging.getLogger("alembic").setLevel(logging.WARNING)
    reporting_errors(app)
