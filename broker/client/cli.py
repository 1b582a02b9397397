"""`onepool ...`: the command line. Every command that prints takes --json.

Errors the user can fix (bad input, unknown job, nothing configured) print one clear
message and exit with status 2; anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from broker.errors import OnepoolError, SpecError
from broker.state.views import JobInfo

FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED", "BUDGET_EXHAUSTED")
app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="onepool: one priority queue over every GPU you can reach.")


def _console(stderr: bool = False) -> Console:
    """A console; when not a terminal (piped, CI), wide enough that tables do not fold."""
    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=220)


out = _console()
err = _console(stderr=True)
_state: dict[str, Any] = {}

HomeOpt = Annotated[Path | None, typer.Option("--home", envvar="ONEPOOL_HOME",
                                              help="broker home (default ./.onepool)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


@app.callback()
def _root(home: HomeOpt = None) -> None:
    _state["home"] = home


def _client():  # type: ignore[no-untyped-def]
    """The SDK client: over HTTP when ONEPOOL_URL is set, else on the home's database."""
    from broker.sdk import Client

    return Client(_state.get("home"))


def _embedded():  # type: ignore[no-untyped-def]
    """The home's database itself (commands that run the broker, the server or the demo)."""
    from broker.client.sdk import Client

    return Client(_state.get("home"))


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _ts(t: float | None) -> str:
    return "" if t is None else datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")


@app.command()
def apply(config: Annotated[Path, typer.Option("-c", "--config", help="onepool.yaml")]
          = Path("onepool.yaml"), as_json: JsonOpt = False) -> None:
    """Apply an onepool.yaml: pools, teams, broker settings."""
    cfg = _client().apply(config)
    if as_json:
        _print_json(cfg.model_dump(mode="json"))
    else:
        out.print(f"applied {config}: {len(cfg.pools)} pools, {len(cfg.teams)} teams", markup=False)


@app.command()
def submit(
    command: Annotated[list[str] | None, typer.Argument(help="the command, after --")] = None,
    file: Annotated[Path | None, typer.Option("-f", "--file", help="job spec YAML")] = None,
    name: Annotated[str | None, typer.Option()] = None,
    team: Annotated[str | None, typer.Option()] = None,
    experiment: Annotated[str | None, typer.Option()] = None,
    priority: Annotated[str | None, typer.Option(help="urgent|high|normal|low")] = None,
    budget_usd: Annotated[float | None, typer.Option("--budget-usd")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs per node")] = None,
    nodes: Annotated[int | None, typer.Option()] = None,
    gpu_type: Annotated[list[str] | None, typer.Option("--gpu-type", help="acceptable type")] = None,
    spot: Annotated[str | None, typer.Option(help="never|allowed|only")] = None,
    checkpoint_interval_s: Annotated[float | None, typer.Option("--checkpoint-interval-s")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Queue a job: `onepool submit --name x --team t --gpus 2 -- python train.py`."""
    data: dict[str, Any] = {}
    if file is not None:
        try:
            loaded = yaml.safe_load(file.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise SpecError(str(file), [f"cannot read job spec: {e}"]) from None
        if not isinstance(loaded, dict):
            raise SpecError(str(file), ["(root): must be a mapping of job fields"])
        data.update(loaded)
    flags = {"name": name, "team": team, "experiment": experiment, "priority": priority,
             "budget_usd": budget_usd, "gpus_per_node": gpus, "nodes": nodes, "gpu_types": gpu_type,
             "spot": spot, "checkpoint_interval_s": checkpoint_interval_s,
             "command": command or None}
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
    info = c.submit(data)
    _warn_if_down(c, f"job {info.id} waits in the queue until one runs (`onepool broker`)")
    if as_json:
        _print_json(info.model_dump())
    else:
        out.print(f"submitted job {info.id} ({info.name}, {info.priority})", markup=False)
        for e in c.events(info.id):  # money (issue 6): why it was made spot-only
            if e.kind == "budget_spot_only":
                out.print(e.message, markup=False)


def _warn_if_down(c: Any, consequence: str) -> None:
    """One warning line on stderr when no broker has cycled recently (issue 10)."""
    h = c.health()
    if h.broker_up:
        return
    if h.down_since is None and not h.ever_ran:
        err.print("[yellow]warning:[/yellow] no broker has run on this database yet (start one: "
                  "`onepool broker`)", highlight=False, soft_wrap=True)
        return
    if h.down_since is None or h.leader is not None:
        why = h.summary
    else:
        why = f"broker down since {_iso(h.down_since)}"
    err.print(f"[yellow]warning:[/yellow] {escape(why)}: {escape(consequence)}", highlight=False,
              soft_wrap=True)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def jobs_table(jobs: list[JobInfo], title: str = "jobs") -> Table:
    t = Table(title=title)
    for col in ("id", "name", "team", "class", "status", "GPUs", "attempts", "preempted",
                "wait s", "GPU-s", "lost GPU-s", "resumed from", "egress $", "why waiting"):
        t.add_column(col, justify="right" if col not in ("name", "team", "class", "status",
                                                         "why waiting") else "left")
    for j in jobs:
        t.add_row(str(j.id), escape(j.name), escape(j.team), j.priority, j.status,
                  f"{j.nodes}x{j.gpus_per_node}", str(j.attempts), str(j.preemptions),
                  f"{j.wait_s:.1f}", f"{j.gpu_s:.0f}", f"{j.lost_gpu_s:.1f}",
                  "" if j.resumed_from_step is None else str(j.resumed_from_step),
                  f"{j.egress_usd:.4f}" if j.egress_bytes else "", escape(j.waiting_reason or ""))
    return t


@app.command()
def status(job: Annotated[int | None, typer.Argument()] = None,
           state: Annotated[list[str] | None, typer.Option("--state", help="filter")] = None,
           team: Annotated[str | None, typer.Option()] = None, as_json: JsonOpt = False) -> None:
    """Show jobs (or one job with its attempts)."""
    c = _client()
    if job is not None:
        info = c.get(job)
        _warn_if_down(c, "the states below may be stale")
        if as_json:
            _print_json(info.model_dump())
            return
        out.print(jobs_table([info], f"job {job}"))
        t = Table(title="attempts")
        for col in ("#", "pool", "GPUs", "state", "started", "ended", "cause", "from step",
                    "to step", "lost GPU-s", "restart s", "restored B", "egress B", "egress $"):
            t.add_column(col)
        for a in info.attempt_list:
            where = " ".join(f"{n}[{','.join(map(str, s))}]" for n, s in a.alloc)
            t.add_row(str(a.number), a.pool, where, a.state, _ts(a.started_at), _ts(a.ended_at),
                      a.cause or a.end_reason or "", _opt(a.restored_step), _opt(a.reached_step),
                      f"{a.lost_gpu_s:.1f}", "" if a.restart_overhead_s is None
                      else f"{a.restart_overhead_s:.1f}", str(a.restore_bytes),
                      str(a.egress_bytes), f"{a.egress_usd:.6f}")
        out.print(t)
        if info.checkpoint_stores:
            out.print("checkpoints lived in: " + ", ".join(info.checkpoint_stores))
        if info.caused_lost_gpu_s:
            out.print(f"its preemptions cost other jobs {info.caused_lost_gpu_s:.1f} GPU-s")
        return
    jobs = c.list(status=state, team=team)
    _warn_if_down(c, "the states below may be stale")
    if as_json:
        _print_json([j.model_dump() for j in jobs])
    else:
        out.print(jobs_table(jobs))


def _opt(v: int | None) -> str:
    return "" if v is None else str(v)


@app.command()
def health(as_json: JsonOpt = False) -> None:
    """Is a broker leading and cycling? Exit status 0 if up, 1 if not."""
    h = _client().health()
    if as_json:
        _print_json(h.model_dump())
    else:
        t = Table(title="broker health")
        for col in ("up", "leader", "fencing", "last cycle", "age s", "down since"):
            t.add_column(col)
        t.add_row("yes" if h.broker_up else "NO", escape(h.leader or ""), str(h.fencing),
                  "" if h.last_cycle_at is None else _iso(h.last_cycle_at),
                  "" if h.last_cycle_age_s is None else f"{h.last_cycle_age_s:.1f}",
                  "" if h.down_since is None else _iso(h.down_since))
        out.print(t)
        out.print(h.summary, markup=False)
    if not h.broker_up:
        raise typer.Exit(1)


@app.command()
def lost(by: Annotated[str, typer.Option(help="team|job (who preempted) or cause")] = "team",
         as_json: JsonOpt = False) -> None:
    """Lost GPU-hours: charged to the preempting team or job, or grouped by cause."""
    if by not in ("team", "job", "cause"):
        raise SpecError("--by", [f"by: must be one of team, job, cause (got {by!r})"])
    rows = _client().lost_work(by)  # type: ignore[arg-type]
    if as_json:
        _print_json([r.model_dump() for r in rows])
        return
    t = Table(title=f"lost work by {by}" + (" (who preempted)" if by != "cause" else ""))
    for col in (by, "lost GPU-s", "lost GPU-h", "attempts", "victim jobs"):
        t.add_column(col)
    for r in rows:
        t.add_row(r.key, f"{r.lost_gpu_s:.1f}", f"{r.lost_gpu_hours:.3f}", str(r.attempts),
                  ", ".join(map(str, r.victims)))
    out.print(t)


@app.command()
def cancel(job: int, as_json: JsonOpt = False) -> None:
    """Cancel a job: pending ones at once, running ones get SIGTERM and the grace period."""
    info = _client().cancel(job)
    if as_json:
        _print_json(info.model_dump())
    else:
        out.print(f"cancel requested for job {job} ({info.status})")


@app.command()
def events(job: Annotated[int | None, typer.Argument()] = None, as_json: JsonOpt = False) -> None:
    """The event log (of one job, or all)."""
    evs = _client().events(job)
    if as_json:
        _print_json([e.model_dump() for e in evs])
        return
    t = Table(title="events")
    for col in ("time", "job", "kind", "message"):
        t.add_column(col)
    for e in evs:
        t.add_row(_ts(e.time), str(e.job_id or ""), e.kind, escape(e.message))
    out.print(t)


@app.command()
def logs(job: int,
         attempt: Annotated[int | None, typer.Option(help="attempt number (default: the newest)")] = None,
         rank: Annotated[int, typer.Option(help="rank of a multi-node job")] = 0,
         follow: Annotated[bool, typer.Option("-f", "--follow", help="keep printing new output "
                                              "(and the next attempts') until the job ends")] = False,
         poll_s: Annotated[float, typer.Option(hidden=True)] = 0.5) -> None:
    """Print a job's output (its newest attempt unless --attempt N); -f follows it."""
    import time

    c = _client()
    chunk = c.logs(job, attempt, rank)
    while True:
        sys.stdout.write(chunk.data)
        sys.stdout.flush()
        if chunk.data:
            chunk = c.logs(job, chunk.attempt, rank, chunk.next_offset)
            continue
        if not follow:
            return
        if chunk.attempt_ended:
            info = c.get(job)
            if attempt is None and info.attempts > chunk.attempt:
                err.print(f"--- attempt {chunk.attempt + 1} ---", highlight=False)
                chunk = c.logs(job, chunk.attempt + 1, rank)
                continue
            if attempt is not None or info.status in FINAL_STATES:
                return
        time.sleep(poll_s)
        chunk = c.logs(job, chunk.attempt, rank, chunk.next_offset)


@app.command()
def broker(config: Annotated[Path | None, typer.Option("-c", "--config",
                                                        help="apply this onepool.yaml first")] = None,
           cycle_s: Annotated[float | None, typer.Option("--cycle-s")] = None,
           once: Annotated[bool, typer.Option("--once", help="run one cycle and exit")] = False
           ) -> None:
    """Run the broker loop (reconcile, then schedule every cycle)."""
    from broker.clock import SystemClock
    from broker.control import service

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    c = _embedded()
    if config is not None:
        c.apply(config)
    service.run(c.store, SystemClock(), cycle_s=cycle_s, max_cycles=1 if once else None)


@app.command()
def demo(as_json: JsonOpt = False,
         timeout: Annotated[float, typer.Option(help="give up after this many seconds")] = 180
         ) -> None:
    """Run the demo: low-priority jobs fill two pools, an urgent gang job preempts, all finish."""
    from broker.client.demo import render, run_demo

    result = run_demo(_state.get("home"), timeout=timeout, progress=not as_json)
    if as_json:
        _print_json(result)
    else:
        render(result, out)


@app.command()
def simulate(
    trace: Annotated[Path, typer.Option("--trace", help="trace CSV")],
    scenario: Annotated[Path, typer.Option("--scenario", help="scenario YAML")],
    policies: Annotated[str | None, typer.Option(help="comma list; default: all")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="write result.json, table.md")] = None,
    limit: Annotated[int | None, typer.Option(help="only the first N jobs")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay a job trace through the same policy under several configurations."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from broker.sim.report import markdown, rich_table
    from broker.sim.run import simulate as run_sim

    names = [p.strip() for p in policies.split(",")] if policies else None
    with Progress(TextColumn("{task.description:<16}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), console=err, transient=as_json) as bar:
        tasks: dict[str, Any] = {}

        def show(fractions: dict[str, float]) -> None:
            for name, f in fractions.items():
                if name not in tasks:
                    tasks[name] = bar.add_task(name, total=1.0)
                bar.update(tasks[name], completed=f)

        result = run_sim(trace, scenario, names, limit=limit, on_progress=show)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
        (out_dir / "table.md").write_text(markdown(result))
    if as_json:
        _print_json(result)
    else:
        out.print(rich_table(result))


from broker.client.cli_money import register as _register_money  # noqa: E402  (issue 6: cost, budget, dashboard)

_register_money(app, lambda: _client(), out)

from broker.client.cli_remote import register as _register_remote  # noqa: E402  (issue 9)

_register_remote(app, _client, _embedded, out, _print_json)


def main() -> None:
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        app()
    except OnepoolError as e:
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except TimeoutError as e:
        err.print(f"[red]timeout:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
