"""`onepool rebalance --dry-run [--json]`: the moves rebalancing would make now (issue 12);
`onepool rebalance --history [--json]`: what finished moves expected and realized, and the
ratio that corrects the next decisions (issue 31).
Registered on the main app like the money commands. Rebalancing itself runs on the leader's
schedule (broker.rebalance in onepool.yaml); this command only shows what it would do,
computed on a read-only snapshot (no lease), on the home's database or over HTTP
(ONEPOOL_URL; a member sees its own team's jobs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.errors import SpecError

if TYPE_CHECKING:
    from rich.console import Console


def register(app: typer.Typer, client: Callable[[], Any], console: Callable[[], Console],
             print_json: Callable[[Any], None]) -> None:
    @app.command()
    def rebalance(
        dry_run: Annotated[bool, typer.Option("--dry-run", help="list the moves it would make now; "
                                              "change nothing")] = False,
        history: Annotated[bool, typer.Option("--history", help="finished moves: expected and realized "
                                              "saving")] = False,
        limit: Annotated[int, typer.Option(help="with --history: the newest N moves")] = 200,
        as_json: Annotated[bool, typer.Option("--json", help="print JSON: [{job, from_pool, to_pool, "
                                              "saving_usd, cost_usd, reason, ...}]")] = False,
    ) -> None:
        """Moves of running jobs to cheaper capacity, and for waiting gang jobs (dry run), or
        what past moves expected and realized (--history)."""
        from rich.table import Table

        if history:
            _history(client().rebalance_history(limit), as_json, console(), print_json)
            return
        if not dry_run:
            raise SpecError("rebalance", ["--dry-run or --history: required; the leader rebalances on its "
                                          "schedule (broker.tasks.rebalance_s in onepool.yaml)"])

        moves = client().rebalance_dry_run()
        if as_json:
            print_json([m.model_dump() for m in moves])
            return
        if not moves:
            console().print("no move pays for itself now")
            return
        t = Table("job", "from", "to", "saving $", "cost $", "reason")
        for m in moves:
            t.add_row(str(m.job), m.from_pool,
                      m.to_pool + (f" (+{m.launch_nodes} node)" if m.launch_nodes else ""),
                      f"{m.saving_usd:.2f}", f"{m.cost_usd:.2f}", m.reason)
        console().print(t)


def _history(out: dict[str, Any], as_json: bool, console: Console, print_json: Callable[[Any], None]) -> None:
    from rich.table import Table

    if as_json:
        print_json(out)
        return
    if not out["moves"]:
        console.print("no move has finished yet")
        return
    t = Table("job", "from", "to", "expected $", "realized $", "net expected $", "net realized $", "reason")
    for m in out["moves"]:
        t.add_row(str(m["job"]), str(m["from_pool"]), str(m["to_pool"]), f"{m['expected_saving_usd']:.2f}",
                  f"{m['realized_saving_usd']:.2f}", f"{m['expected_net_usd']:.2f}",
                  f"{m['realized_net_usd']:.2f}", str(m["reason"]))
    console.print(t)
    for kind, tot in out["totals"].items():
        console.print(f"{kind}: {tot['moves']} moves expected ${tot['expected_saving_usd']:,.2f}, realized "
                      f"${tot['realized_saving_usd']:,.2f}; the next decisions count "
                      f"{tot['ratio']:.0%} of a move's expected saving", markup=False)
