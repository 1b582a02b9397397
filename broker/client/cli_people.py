"""`onepool update JOB`, `onepool hold JOB`, `onepool release JOB`: change a job after its
submit (issue 28), under the submit's rules, embedded or over HTTP (broker.client.sdk_changes);
`onepool lost --by team|job|user|cause`: who caused the work lost to preemptions.

Registered on the main typer app by `register(app, client, out, print_json)` like the money
commands, so they share its --home and its error handling (OnepoolError -> one message, exit
status 2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.errors import SpecError

if TYPE_CHECKING:
    from rich.console import Console

    from broker.wire import JobInfo

JobArg = Annotated[int, typer.Argument(metavar="JOB", help="the job's id")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the job as JSON")]
LOST_BY = ("team", "job", "cause", "user")  # broker.checkpoint.telemetry.LOST_BY


def register(app: typer.Typer, client: Callable[[], Any], out: Callable[[], Console],
             print_json: Callable[[Any], None]) -> None:
    def show(info: JobInfo, as_json: bool, said: str) -> None:
        if as_json:
            print_json(info.model_dump())
        else:
            out().print(said, markup=False)

    @app.command()
    def update(job: JobArg,
               priority: Annotated[str | None, typer.Option(metavar="P", help="urgent|high|normal|low")]
               = None,
               budget_usd: Annotated[float | None, typer.Option(
                   "--budget-usd", metavar="USD", help="the job's new budget (a stopped job resumes)")]
               = None,
               as_json: JsonOpt = False) -> None:
        """Change a job's priority and/or budget, under the same rules as a submit (the team's
        budget; a budget must cover the job's estimate). A running job keeps its class until
        its next placement."""
        info = client().update(job, priority=priority, budget_usd=budget_usd)
        budget = "none" if info.budget_usd is None else f"${info.budget_usd:.2f}"
        show(info, as_json, f"job {job}: priority {info.priority}, budget {budget}, spot "
                            f"{info.spot} ({info.status})")

    @app.command()
    def hold(job: JobArg, as_json: JsonOpt = False) -> None:
        """Keep a waiting job from starting until `onepool release JOB` (a running job is
        refused: a hold stops nothing)."""
        info = client().hold(job)
        show(info, as_json, f"job {job} is on hold ({info.status}): `onepool release {job}` lets it start")

    @app.command()
    def release(job: JobArg, as_json: JsonOpt = False) -> None:
        """Let a held job start again (its place in the queue is unchanged)."""
        info = client().release(job)
        show(info, as_json, f"job {job} released ({info.status})")

    @app.command()
    def lost(by: Annotated[str, typer.Option(metavar="KEY", help="team|job|user (who preempted) or cause")]
             = "team", as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
        """Lost GPU-hours: charged to the preempting team, job or user, or grouped by cause."""
        if by not in LOST_BY:
            raise SpecError("--by", [f"by: must be one of {', '.join(LOST_BY)} (got {by!r})"])
        rows = client().lost_work(by)
        if as_json:
            print_json([r.model_dump() for r in rows])
            return
        from rich.table import Table

        t = Table(title=f"lost work by {by}" + (" (who preempted)" if by != "cause" else ""))
        for col in (by, "lost GPU-s", "lost GPU-h", "restart GPU-s", "attempts", "victim jobs"):
            t.add_column(col)
        for r in rows:
            t.add_row(r.key, f"{r.lost_gpu_s:.1f}", f"{r.lost_gpu_hours:.3f}", f"{r.restart_gpu_s:.1f}",
                      str(r.attempts), ", ".join(map(str, r.victims)))
        out().print(t)
