"""`onepool ...`: the command line. Every command that prints takes --json.

Errors the user can fix (bad input, unknown job, nothing configured) print one clear
message and exit with status 2; anything else is a bug and shows its traceback.

Each command imports what it needs when it runs (the database layer alone takes longer to
import than `onepool status` may take): this module imports only typer at the top, and
`status` reads a local SQLite home through broker.client.reader when it can
(bench/cli_speed.py measures it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.errors import OnepoolError, SpecError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from broker.client.sdk import Client
    from broker.state.views import JobInfo

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="onepool: one priority queue over every GPU you can reach.")
_state: dict[str, Any] = {}

HomeOpt = Annotated[Path | None, typer.Option("--home", envvar="ONEPOOL_HOME", metavar="DIR",
                                              help="broker home (default ./.onepool)")]
from broker.client.cli_code import print_code_note, print_phases  # noqa: E402  (issue 26)
from broker.client.cli_run import JsonOpt  # noqa: E402  (one --json option for every command)

STATUS_LIMIT = 20  # `status` shows the running jobs, then the newest, this many (--limit, --all)
NAME_RULE = "lowercase letters, digits, '_', '.', '-' (1-63 chars, starting with a letter or digit)"


def _console(stderr: bool = False) -> Console:
    """A console; when not a terminal (piped, CI), wide enough that tables do not fold."""
    from rich.console import Console

    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=220)


def _out() -> Console:
    c = globals().get("out")
    if c is None:
        c = globals()["out"] = _console()
    return c


def _err() -> Console:
    c = globals().get("err")
    if c is None:
        c = globals()["err"] = _console(stderr=True)
    return c


def __getattr__(name: str) -> Any:  # `out` and `err` are made on first use (tests may replace them)
    if name == "out":
        return _out()
    if name == "err":
        return _err()
    raise AttributeError(name)


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _table(title: str, columns: list[str], right: tuple[str, ...] = ()) -> Table:
    from rich.table import Table

    t = Table(title=title)
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left")
    return t


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


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _ts(t: float | None) -> str:
    """A broker time as the local wall-clock time (the date too when not today)."""
    if t is None:
        return ""
    from datetime import datetime

    d = datetime.fromtimestamp(t).astimezone()
    today = datetime.now().astimezone().date()
    return d.strftime("%H:%M:%S" if d.date() == today else "%Y-%m-%d %H:%M:%S")


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(max(0.0, seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


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
    data: dict[str, Any] = {}
    if file is not None:
        import yaml

        try:
            loaded = yaml.safe_load(file.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise SpecError(str(file), [f"cannot read job spec: {e}"]) from None
        if not isinstance(loaded, dict):
            raise SpecError(str(file), ["(root): must be a mapping of job fields"])
        from broker.spec_code import relative_to_file

        data.update(loaded, **({"code": relative_to_file(loaded["code"], file)} if "code" in loaded else {}))
    flags = {"name": name, "team": team, "experiment": experiment, "priority": priority,
             "budget_usd": budget_usd, "gpus_per_node": gpus, "nodes": nodes, "gpu_types": gpu_type,
             "spot": spot, "checkpoint_interval_s": checkpoint_interval_s, "deadline": deadline,
             "command": command or None, "array": array, "after": after, "image": image, "code": code,
             "setup": setup}
    data.update({k: v for k, v in flags.items() if v is not None})
    if env:
        bad = [e for e in env if "=" not in e]
        if bad:
            raise SpecError("job", [f"env: expected KEY=VALUE (got {bad[0]!r})"])
        data["env"] = {**data.get("env", {}), **dict(e.split("=", 1) for e in env)}
    import os

    required = ("name", "command") if os.environ.get("ONEPOOL_URL") else ("name", "team", "command")
    missing = [k for k in required if not data.get(k)]  # over HTTP the token's team is the default
    if missing:
        raise SpecError("job", [f"{k}: required (give --{k} or put it in -f FILE)"
                                if k != "command" else "command: required (after --)"
                                for k in missing])
    c = _client()
    if dry_run:  # issue 29: the estimate, nothing written
        from broker.client.cli_estimate import summary

        est = c.estimate(data)
        if as_json:
            _print_json(est.model_dump())
        else:
            _out().print(summary(est, _ts), markup=False)
        return
    info = c.submit(data)
    print_code_note(c, _err())  # what the HTTP client did with the code folder (issue 26)
    _warn_if_down(c, f"job {info.id} waits in the queue until one runs (`onepool broker`)")
    if as_json:
        _print_json(info.model_dump())
    else:
        _out().print(f"submitted job {info.id} ({info.name}, {info.priority})" if info.array_id is None
                     else f"submitted array {info.array_id} ({info.name}, {info.priority}): its "
                          f"elements are jobs {info.id} and up", markup=False)
        for e in c.events(info.id):  # money (issue 6): why it was made spot-only
            if e.kind == "budget_spot_only":
                _out().print(e.message, markup=False)


def _progress(j: JobInfo) -> str:
    """`step 12/40, ETA 14:03:10` (or what is known of it)."""
    if j.progress_step is None:
        return ""
    text = f"step {j.progress_step}" + (f"/{j.progress_total}" if j.progress_total is not None else "")
    return text + (f", ETA {_ts(j.eta)}" if j.eta is not None else "")


def _warn_if_down(c: Any, consequence: str) -> None:
    """One warning line on stderr when no broker has cycled recently (issue 10)."""
    h = c.health()
    if h.broker_up:
        return
    if h.down_since is None and not h.ever_ran:
        _err().print("[yellow]warning:[/yellow] no broker has run on this database yet (start one: "
                     "`onepool broker`)", highlight=False, soft_wrap=True)
        return
    if h.down_since is None or h.leader is not None:
        why = h.summary
    else:
        why = f"broker down since {_iso(h.down_since)}"
    _err().print(f"[yellow]warning:[/yellow] {_esc(why)}: {_esc(consequence)}", highlight=False,
                 soft_wrap=True)


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def jobs_table(jobs: list[JobInfo], title: str = "jobs") -> Table:
    t = _table(title, ["id", "name", "team", "class", "status", "GPUs", "attempts", "preempted",
                       "wait s", "GPU-s", "lost GPU-s", "resumed from", "progress", "egress $",
                       "why waiting"],
               right=("id", "GPUs", "attempts", "preempted", "wait s", "GPU-s", "lost GPU-s",
                      "resumed from", "egress $"))
    for j in jobs:
        name = j.name if j.array_id is None else f"{j.name} [{j.array_id}:{j.array_index}]"
        t.add_row(str(j.id), _esc(name), _esc(j.team), j.priority,
                  j.status + (" (held idle)" if j.held_idle else ""),
                  f"{j.nodes}x{j.gpus_per_node}", str(j.attempts), str(j.preemptions),
                  f"{j.wait_s:.1f}", f"{j.gpu_s:.0f}", f"{j.lost_gpu_s:.1f}",
                  "" if j.resumed_from_step is None else str(j.resumed_from_step), _progress(j),
                  f"{j.egress_usd:.4f}" if j.egress_bytes else "", _esc(j.waiting_reason or ""))
    return t


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
        info = c.get(job)
        _warn_if_down(c, "the states below may be stale")
        if as_json:
            _print_json(info.model_dump())
            return
        out = _out()
        out.print(jobs_table([info], f"job {job}"))
        t = _table("attempts", ["#", "pool", "GPUs", "state", "started", "ended", "cause", "from step",
                                "to step", "lost GPU-s", "restart s", "restored B", "egress B", "egress $"])
        for a in info.attempt_list:
            where = " ".join(f"{n}[{','.join(map(str, s))}]" for n, s in a.alloc)
            t.add_row(str(a.number), a.pool, where, a.state, _ts(a.started_at), _ts(a.ended_at),
                      a.cause or a.end_reason or "", _opt(a.restored_step), _opt(a.reached_step),
                      f"{a.lost_gpu_s:.1f}", "" if a.restart_overhead_s is None
                      else f"{a.restart_overhead_s:.1f}", str(a.restore_bytes),
                      str(a.egress_bytes), f"{a.egress_usd:.6f}")
        out.print(t)
        print_phases(info, out)  # issue 26: where each resume spent its time
        if info.checkpoint_stores:
            out.print("checkpoints lived in: " + ", ".join(info.checkpoint_stores), markup=False)
        if info.caused_lost_gpu_s:
            out.print(f"its preemptions cost other jobs {info.caused_lost_gpu_s:.1f} GPU-s")
        from broker.client.cli_intervals import calibration_lines  # issue 31: interval, deadline

        for line in calibration_lines(info):
            out.print(line, markup=False)
        live = info.attempt_list[-1] if info.attempt_list and info.attempt_list[-1].ended_at is None else None
        if live is not None and live.gpu_util_pct is not None:
            idle = (f"; HELD BUT IDLE: below 5% since {_ts(live.gpu_idle_since)}" if live.held_idle
                    else "")
            out.print(f"GPU utilization: {live.gpu_util_pct:.0f}% now, {live.gpu_util_mean_pct or 0:.0f}% "
                      f"mean over this attempt{idle}", markup=False)
        return
    if array is not None:
        from broker.client.cli_arrays import elements

        jobs = elements(c, array, team)
    else:
        jobs = (c.list(status=state, team=team, user=user) if all_ else
                c.list(status=state, team=team, limit=limit, newest=True, user=user))
    _warn_if_down(c, "the states below may be stale")
    if not as_json and array is None:
        counts = c.counts(team)
        shown = "" if all_ else (f"; showing {len(jobs)}, the running first, then the newest "
                                 "(--limit N, --all)")
        _out().print(f"{sum(counts.values())} jobs: " + ", ".join(
            f"{n} {st.lower()}" for st, n in sorted(counts.items())) + shown, markup=False)
    if estimate:  # issue 29: the same estimate as submit --dry-run, per pending job
        from broker.client.cli_estimate import table
        from broker.client.estimate_info import MAX_ESTIMATES

        ests = _client().estimates([j.id for j in jobs if j.status == "PENDING"][:MAX_ESTIMATES])
        if as_json:
            _print_json({"jobs": [j.model_dump() for j in jobs], "estimates": [e.model_dump() for e in ests]})
        else:
            _out().print(jobs_table(jobs))
            _out().print(table(ests, _ts, _table))
        return
    if as_json:
        _print_json([j.model_dump() for j in jobs])
    else:
        _out().print(jobs_table(jobs))


def _opt(v: int | None) -> str:
    return "" if v is None else str(v)


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
    info = _client().cancel(job)
    if as_json:
        _print_json(info.model_dump())
    elif info.status == "CANCELLED":
        _out().print(f"job {job} cancelled")
    else:
        _out().print(f"cancel requested for job {job} ({info.status}): the broker stops it "
                     "(SIGTERM, then its grace period) and it ends CANCELLED")


@app.command()
def events(job: Annotated[int | None, typer.Argument(metavar="[JOB]", help="one job's id")] = None,
           user: Annotated[str | None, typer.Option(metavar="USER", help="only of the jobs USER "
                                                    "submitted")] = None,
           as_json: JsonOpt = False) -> None:
    """The event log (of one job, or all), with who made each happen."""
    evs = _client().events(job, user=user) if user else _client().events(job)
    if as_json:
        _print_json([e.model_dump() for e in evs])
        return
    t = _table("events", ["time", "job", "kind", "message", "by"])
    for e in evs:
        t.add_row(_ts(e.time), str(e.job_id or ""), e.kind, _esc(e.message), _esc(e.actor or ""))
    _out().print(t)


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
    import logging

    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        app()
    except OnepoolError as e:
        _err().print(f"[red]error:[/red] {_esc(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except ModuleNotFoundError as e:  # the thin client (`pip install onepool`) running a server command
        from broker.sdk import SERVER_MODULES

        if (e.name or "").split(".")[0] not in SERVER_MODULES:
            raise
        msg = (f"this command needs onepool's server parts ({e.name} is not installed here): run "
               "`pip install 'onepool[server]'`")
        _err().print(f"[red]error:[/red] {_esc(msg)}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except TimeoutError as e:
        _err().print(f"[red]timeout:[/red] {_esc(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
