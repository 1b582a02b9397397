"""The bodies of `onepool submit`, `status`, `cancel` and `events`, without typer: the typer app
(broker.client.cli_app) and the HTTP fast path (broker.client.cli_fast) parse the command
line their own way and both call these, so the two print the same thing.

`c` is anything with the SDK's methods used here (`submit`, `events`, `health`, `get`, `list`,
`counts`, `cancel`): the SDK client, the fast SQLite reader, or broker.client.views.ThinClient.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.client.cli_out import _esc, _opt, _out, _print_json, _table, _ts, _warn_if_down, jobs_table
from broker.errors import SpecError

STATUS_LIMIT = 20  # `status` shows the running jobs, then the newest, this many (--limit, --all)


def submit_data(file: Path | None, flags: dict[str, Any], env: list[str] | None,
                over_http: bool) -> dict[str, Any]:
    """A submit's fields: the job spec YAML `file` (if any), then the flags given (None: not
    given), then `env` (KEY=VALUE each). Raises SpecError naming a file that cannot be read, a
    malformed --env, or a required field missing (over HTTP the token's team is the default)."""
    data: dict[str, Any] = {}
    if file is not None:
        import yaml

        try:
            loaded = yaml.safe_load(file.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise SpecError(str(file), [f"cannot read job spec: {e}"]) from None
        if not isinstance(loaded, dict):
            raise SpecError(str(file), ["(root): must be a mapping of job fields"])
        if "code" in loaded:  # a folder named in the YAML is beside the YAML (issue 26)
            from broker.codepack import relative_to_file

            loaded["code"] = relative_to_file(loaded["code"], file)
        data.update(loaded)
    data.update({k: v for k, v in flags.items() if v is not None})
    if env:
        bad = [e for e in env if "=" not in e]
        if bad:
            raise SpecError("job", [f"env: expected KEY=VALUE (got {bad[0]!r})"])
        data["env"] = {**data.get("env", {}), **dict(e.split("=", 1) for e in env)}
    required = ("name", "command") if over_http else ("name", "team", "command")
    missing = [k for k in required if not data.get(k)]
    if missing:
        raise SpecError("job", [f"{k}: required (give --{k} or put it in -f FILE)"
                                if k != "command" else "command: required (after --)"
                                for k in missing])
    return data


def submit_and_print(c: Any, data: dict[str, Any], as_json: bool) -> None:
    """Submit `data` through `c` and print the job (or array) made."""
    info = c.submit(data)
    from broker.client.cli_code import print_code_note
    from broker.client.cli_out import _err

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


def show_job(c: Any, job: int, as_json: bool) -> None:
    """`onepool status JOB`: the job, its attempts, where its checkpoints lived, its GPU use."""
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
    from broker.client.cli_code import print_phases
    from broker.client.cli_intervals import calibration_lines

    print_phases(info, out)  # issue 26: where each resume spent its time
    if info.checkpoint_stores:
        out.print("checkpoints lived in: " + ", ".join(info.checkpoint_stores), markup=False)
    if info.caused_lost_gpu_s:
        out.print(f"its preemptions cost other jobs {info.caused_lost_gpu_s:.1f} GPU-s")
    for line in calibration_lines(info):  # issue 31: checkpoint interval, deadline
        out.print(line, markup=False)
    live = info.attempt_list[-1] if info.attempt_list and info.attempt_list[-1].ended_at is None else None
    if live is not None and live.gpu_util_pct is not None:
        idle = (f"; HELD BUT IDLE: below 5% since {_ts(live.gpu_idle_since)}" if live.held_idle
                else "")
        out.print(f"GPU utilization: {live.gpu_util_pct:.0f}% now, {live.gpu_util_mean_pct or 0:.0f}% "
                  f"mean over this attempt{idle}", markup=False)


def show_jobs(c: Any, state: list[str] | None, team: str | None, all_: bool, limit: int,
              array: int | None, estimate: bool, as_json: bool, client: Callable[[], Any],
              user: str | None = None) -> None:
    """`onepool status`: a page of the running jobs first, then the newest, under a line of
    counts per state (or every job with `all_`, or one array's elements; only `user`'s jobs
    when given). `client()` gives the SDK client that answers estimates (`estimate`)."""
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

        ests = client().estimates([j.id for j in jobs if j.status == "PENDING"][:MAX_ESTIMATES])
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


def cancel_and_print(c: Any, job: int, as_json: bool) -> None:
    """`onepool cancel JOB`: cancel it and say what happens next."""
    info = c.cancel(job)
    if as_json:
        _print_json(info.model_dump())
    elif info.status == "CANCELLED":
        _out().print(f"job {job} cancelled")
    else:
        _out().print(f"cancel requested for job {job} ({info.status}): the broker stops it "
                     "(SIGTERM, then its grace period) and it ends CANCELLED")


def show_events(c: Any, job: int | None, as_json: bool, user: str | None = None) -> None:
    """`onepool events [JOB]`: the event log (of one job, or all; of `user`'s jobs), with who
    made each happen."""
    evs = c.events(job, user=user) if user else c.events(job)
    if as_json:
        _print_json([e.model_dump() for e in evs])
        return
    t = _table("events", ["time", "job", "kind", "message", "by"])
    for e in evs:
        t.add_row(_ts(e.time), str(e.job_id or ""), e.kind, _esc(e.message), _esc(e.actor or ""))
    _out().print(t)
