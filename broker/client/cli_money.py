"""`onepool cost`, `onepool budget ...` and `onepool dashboard`: the money commands (issue 6).

Registered on the main typer app by `register(app, client, out)` so they share its --home
and its error handling (OnepoolError -> one message, exit status 2). Like the rest of the CLI,
each command imports what it needs when it runs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.errors import SpecError

if TYPE_CHECKING:
    from rich.console import Console

DASHBOARD_APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
# broker.state.costs.COST_BY
COST_VIEWS = ("experiment", "team", "job", "pool", "market", "day", "array", "user")
STOP_GRACE_S = 10.0  # `onepool dashboard`: how long Streamlit gets to stop before it is killed


def parse_since(v: str | None) -> float | None:
    """--since as epoch seconds, an ISO date/time (UTC if no zone), or a relative '7d'/'12h'/'30m'.
    Raises SpecError naming the accepted forms."""
    if v is None:
        return None
    from datetime import UTC, datetime

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


def register(app: typer.Typer, client: Callable[[], Any], out: Callable[[], Console]) -> None:
    """Add the money commands to `app`; `client()` returns a broker.client.sdk.Client, `out()`
    the console to print to."""
    budget_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Job and team budgets.")
    app.add_typer(budget_app, name="budget")

    @app.command()
    def cost(by: Annotated[str, typer.Option(metavar="VIEW", help="|".join(COST_VIEWS) + " (day: UTC)")]
             = "experiment",
             since: Annotated[str | None, typer.Option(
                 metavar="WHEN", help="only from then: epoch s, ISO date (UTC), or an age like 7d, 12h")]
             = None,
             as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
        """What things cost: USD, GPU-hours and lost work per experiment, team, job, pool, market
        or day. Every view adds up to the same total: GPU time no job used has its own rows
        (idle on-prem, idle rented, boot/drain)."""
        if by not in COST_VIEWS:
            raise SpecError("--by", [f"by: must be one of {', '.join(COST_VIEWS)} (got {by!r})"])
        rows = client().costs(by, parse_since(since))
        if as_json:
            _json([{"key": r.key, "usd": round(r.usd, 6), "gpu_hours": round(r.gpu_hours, 6),
                    "idle_usd": round(r.idle_usd, 6), "lost_gpu_hours": round(r.lost_gpu_hours, 6),
                    "lost_usd": round(r.lost_usd, 6), "jobs": r.jobs} for r in rows])
            return
        from rich.markup import escape
        from rich.table import Table

        t = Table(title=f"cost by {by}" + (f" since {since}" if since else ""),
                  caption="idle USD: GPUs paid for that no job used (idle, boot, drain); "
                          "lost: work redone after interruptions (a share of USD, not added to it)")
        for col in (by, "USD", "GPU-h", "idle USD", "lost GPU-h", "lost USD", "jobs"):
            t.add_column(col, justify="left" if col == by else "right")
        for r in rows:
            t.add_row(escape(r.key), f"{r.usd:.4f}", f"{r.gpu_hours:.4f}", f"{r.idle_usd:.4f}",
                      f"{r.lost_gpu_hours:.4f}", f"{r.lost_usd:.4f}", str(r.jobs))
        t.add_section()
        t.add_row("total", f"{sum(r.usd for r in rows):.4f}", f"{sum(r.gpu_hours for r in rows):.4f}",
                  f"{sum(r.idle_usd for r in rows):.4f}", f"{sum(r.lost_gpu_hours for r in rows):.4f}",
                  f"{sum(r.lost_usd for r in rows):.4f}", "")
        out().print(t)

    @budget_app.command("set", context_settings={"ignore_unknown_options": True})
    def budget_set(
        args: Annotated[list[str], typer.Argument(metavar="[JOB] AMOUNT",
                                                  help="a job id and USD, or USD with --team")],
        team: Annotated[str | None, typer.Option(metavar="TEAM",
                                                 help="set this team's window budget instead")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    ) -> None:
        """Raise (or set) a budget: `onepool budget set 12 40` or `onepool budget set --team nlp 5000`.
        A job stopped as BUDGET_EXHAUSTED goes back to the queue and resumes from its checkpoint."""
        want = 1 if team else 2
        if len(args) != want:
            raise SpecError("budget set", ["give JOB AMOUNT, or --team TEAM AMOUNT"
                                           + (f" (got {' '.join(args)})" if args else "")])
        try:
            amount = float(args[-1])
        except ValueError:
            raise SpecError("budget set", [f"amount: expected a number of USD (got {args[-1]!r})"]) from None
        try:
            job = int(args[0]) if team is None else None
        except ValueError:
            raise SpecError("budget set", [f"job: expected a job id (got {args[0]!r})"]) from None
        msg = client().set_budget(amount, job_id=job, team=team)
        if as_json:
            _json({"job": job, "team": team, "usd": amount, "message": msg})
        else:
            out().print(msg, markup=False)

    @budget_app.command("show")
    def budget_show(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
        """Every team's window budget: amount, spent, state."""
        rows = client().budgets()
        if as_json:
            _json([{"team": b.team, "usd": b.amount, "spent": b.spent, "window": b.window,
                    "state": b.state} for b in rows])
            return
        from rich.table import Table

        t = Table(title="team budgets")
        for col in ("team", "window", "budget USD", "spent USD", "left USD", "state"):
            t.add_column(col)
        for b in rows:
            t.add_row(b.team, b.window, "-" if b.amount is None else f"{b.amount:.2f}",
                      f"{b.spent:.4f}", "-" if b.remaining is None else f"{b.remaining:.2f}", b.state)
        out().print(t)

    @app.command()
    def dashboard(port: Annotated[int, typer.Option(metavar="PORT", help="port to listen on")] = 8501,
                  address: Annotated[str, typer.Option(metavar="ADDR", help="listen address")] = "127.0.0.1",
                  share_token: Annotated[bool, typer.Option(
                      "--share-token", help="off loopback, show everyone who reaches the page what "
                                            "ONEPOOL_TOKEN sees (default: each viewer logs in)")] = False,
                  ) -> None:
        """Open the Streamlit dashboard (http://ADDR:PORT): of the server at ONEPOOL_URL, as the
        token's team (ONEPOOL_TOKEN, or pasted on its login page), or of this broker home. Off
        loopback every viewer logs in with a token of their own. SIGTERM, SIGINT and SIGHUP are
        passed on to Streamlit, and this command waits for it to stop."""
        import os

        from dashboard.tabs import LOOPBACK

        env = dict(os.environ)
        url = env.get("ONEPOOL_URL")
        if url:
            where, source = f"the server {url}", ["--url", url]
        else:
            home = str(client().store.home)
            where, source = home, ["--home", home]
            env["ONEPOOL_HOME"] = home
        if address not in LOOPBACK and not share_token:
            env.pop("ONEPOOL_TOKEN", None)  # a viewer sees what their own token may see
        cmd = [sys.executable, "-m", "streamlit", "run", str(DASHBOARD_APP),
               "--server.headless", "true", "--server.address", address, "--server.port", str(port),
               "--browser.gatherUsageStats", "false", "--", *source]
        out().print(f"dashboard of {where} at http://{address}:{port} (Ctrl-C stops it)", markup=False)
        raise typer.Exit(run_forwarding_signals(cmd, env))


def run_forwarding_signals(cmd: list[str], env: dict[str, str], grace_s: float = STOP_GRACE_S) -> int:
    """Run `cmd` as a child; SIGTERM/SIGINT/SIGHUP sent to this process are passed on to it, and
    it gets `grace_s` to stop before it is killed. Returns its exit status (128 + N when a
    signal N ended it), so nothing is left listening on the port when this returns."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd, env=env)
    asked: list[float] = []

    def forward(sig: int, _frame: object) -> None:
        if not asked:
            asked.append(time.monotonic())
        proc.send_signal(sig)

    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    before = {s: signal.signal(s, forward) for s in sigs}
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if asked and time.monotonic() - asked[0] > grace_s:
                    proc.kill()
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    return 128 - code if code < 0 else code
