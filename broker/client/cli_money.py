"""`onepool cost`, `onepool budget ...` and `onepool dashboard`: the money commands (issue 6).

Registered on the main typer app by `register(app, client, out)` so they share its --home
and its error handling (OnepoolError -> one message, exit status 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from broker.errors import SpecError
from broker.state.costs import COST_BY

DASHBOARD_APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


def parse_since(v: str | None) -> float | None:
    """--since as epoch seconds, an ISO date/time (UTC if no zone), or a relative '7d'/'12h'/'30m'.
    Raises SpecError naming the accepted forms."""
    if v is None:
        return None
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    try:
        if v[-1:] in units and v[:-1].replace(".", "", 1).isdigit():
            from broker.clock import SystemClock

            return SystemClock().now() - float(v[:-1]) * units[v[-1]]
        if v.replace(".", "", 1).isdigit():
            return float(v)
        d = datetime.fromisoformat(v)
        return (d if d.tzinfo else d.replace(tzinfo=UTC)).timestamp()
    except ValueError:
        raise SpecError("--since", [f"since: expected epoch seconds, an ISO date like 2026-12-01, "
                                    f"or a relative age like 7d, 12h, 30m (got {v!r})"]) from None


def _json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def register(app: typer.Typer, client: Callable[[], Any], out: Console) -> None:
    """Add the money commands to `app`; `client()` returns a broker.client.sdk.Client."""
    budget_app = typer.Typer(no_args_is_help=True, help="Job and team budgets.")
    app.add_typer(budget_app, name="budget")

    @app.command()
    def cost(by: Annotated[str, typer.Option(help="experiment|team|pool|job")] = "experiment",
             since: Annotated[str | None, typer.Option(help="epoch s, ISO date, or 7d/12h")] = None,
             as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
        """What things cost: USD, GPU-hours and lost work per experiment, team, pool or job."""
        if by not in COST_BY:
            raise SpecError("--by", [f"by: must be one of {', '.join(COST_BY)} (got {by!r})"])
        rows = client().costs(by, parse_since(since))  # type: ignore[arg-type]
        if as_json:
            _json([{"key": r.key, "usd": round(r.usd, 6), "gpu_hours": round(r.gpu_hours, 6),
                    "lost_gpu_hours": round(r.lost_gpu_hours, 6), "jobs": r.jobs} for r in rows])
            return
        t = Table(title=f"cost by {by}" + (f" since {since}" if since else ""))
        for col in (by, "USD", "GPU-h", "lost GPU-h", "lost USD", "idle USD", "jobs"):
            t.add_column(col, justify="left" if col == by else "right")
        for r in rows:
            t.add_row(escape(r.key), f"{r.usd:.4f}", f"{r.gpu_hours:.4f}", f"{r.lost_gpu_hours:.4f}",
                      f"{r.lost_usd:.4f}", f"{r.idle_usd:.4f}", str(r.jobs))
        t.add_section()
        t.add_row("total", f"{sum(r.usd for r in rows):.4f}", f"{sum(r.gpu_hours for r in rows):.4f}",
                  f"{sum(r.lost_gpu_hours for r in rows):.4f}", f"{sum(r.lost_usd for r in rows):.4f}",
                  f"{sum(r.idle_usd for r in rows):.4f}", "")
        out.print(t)

    @budget_app.command("set")
    def budget_set(
        args: Annotated[list[str], typer.Argument(help="JOB AMOUNT, or AMOUNT with --team")],
        team: Annotated[str | None, typer.Option(help="set this team's window budget")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    ) -> None:
        """Raise (or set) a budget: `onepool budget set 12 40` or `onepool budget set --team nlp 5000`.
        A job stopped as BUDGET_EXHAUSTED goes back to the queue and resumes from its checkpoint."""
        want = 1 if team else 2
        if len(args) != want:
            raise SpecError("budget set", ["give JOB AMOUNT, or --team TEAM AMOUNT"])
        try:
            amount = float(args[-1])
            job = int(args[0]) if team is None else None
        except ValueError:
            raise SpecError("budget set", [f"expected a job id and an amount in USD (got {args})"]) from None
        msg = client().set_budget(amount, job_id=job, team=team)
        if as_json:
            _json({"job": job, "team": team, "usd": amount, "message": msg})
        else:
            out.print(msg, markup=False)

    @budget_app.command("show")
    def budget_show(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
        """Every team's window budget: amount, spent, state."""
        rows = client().budgets()
        if as_json:
            _json([{"team": b.team, "usd": b.amount, "spent": b.spent, "window": b.window,
                    "state": b.state} for b in rows])
            return
        t = Table(title="team budgets")
        for col in ("team", "window", "budget USD", "spent USD", "left USD", "state"):
            t.add_column(col)
        for b in rows:
            t.add_row(b.team, b.window, "-" if b.amount is None else f"{b.amount:.2f}",
                      f"{b.spent:.4f}", "-" if b.remaining is None else f"{b.remaining:.2f}", b.state)
        out.print(t)

    @app.command()
    def dashboard(port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 8501,
                  address: Annotated[str, typer.Option(help="listen address")] = "127.0.0.1") -> None:
        """Open the Streamlit dashboard of this broker home (http://127.0.0.1:PORT)."""
        home = str(client().store.home)
        cmd = [sys.executable, "-m", "streamlit", "run", str(DASHBOARD_APP),
               "--server.headless", "true", "--server.address", address, "--server.port", str(port),
               "--browser.gatherUsageStats", "false", "--", "--home", home]
        out.print(f"dashboard of {home} at http://{address}:{port} (Ctrl-C stops it)", markup=False)
        raise typer.Exit(subprocess.call(cmd, env={**os.environ, "ONEPOOL_HOME": home}))
