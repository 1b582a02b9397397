"""`onepool broker`, `onepool demo` and `onepool simulate`: the commands that run something on
this machine (the broker loop, the demo lab, a trace replay) rather than ask a server."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.client.cli_remote import LogFormat

if TYPE_CHECKING:
    from rich.console import Console

JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


def register(app: typer.Typer, embedded: Callable[[], Any], home: Callable[[], Path | None],
             out: Callable[[], Console], err: Callable[[], Console],
             print_json: Callable[[Any], None]) -> None:
    """Add the commands to `app`: `embedded()` opens the home's client, `home()` is the
    --home given (None: the default), `out`/`err` the consoles, `print_json` prints --json."""

    @app.command()
    def broker(config: Annotated[Path | None, typer.Option("-c", "--config", metavar="FILE",
                                                            help="apply this onepool.yaml first")] = None,
               cycle_s: Annotated[float | None, typer.Option(
                   "--cycle-s", metavar="S", help="seconds between cycles (default: broker.cycle_s)")] = None,
               once: Annotated[bool, typer.Option("--once", help="run one cycle and exit")] = False,
               log_format: LogFormat = "text",
               ) -> None:
        """Run the broker loop (reconcile, then schedule every cycle). Its local pools' ranks run
        as ONEPOOL_RUN_AS and get ONEPOOL_PASS_ENV (see providers.isolation)."""
        from broker.clock import SystemClock
        from broker.control import service
        from broker.observe.logs import setup
        from providers.isolation import Isolation

        Isolation.for_host("broker settings (ONEPOOL_RUN_AS, ONEPOOL_PASS_ENV)")
        setup(log_format)
        c = embedded()
        if config is not None:
            c.apply(config)
        service.run(c.store, SystemClock(), cycle_s=cycle_s, max_cycles=1 if once else None)


    @app.command()
    def demo(as_json: JsonOpt = False,
             timeout: Annotated[float, typer.Option(metavar="S",
                                                    help="give up after this many seconds")] = 180
             ) -> None:
        """Run the demo: low-priority jobs fill two pools, an urgent gang job preempts, all finish."""
        from broker.client.demo import render, run_demo

        result = run_demo(home(), timeout=timeout, progress=not as_json)
        if as_json:
            print_json(result)
        else:
            render(result, out())


    @app.command()
    def simulate(
        trace: Annotated[Path, typer.Option("--trace", metavar="CSV", help="the job trace to replay")],
        scenario: Annotated[Path, typer.Option("--scenario", metavar="YAML",
                                               help="pools, teams, classes and prices to replay it on")],
        policies: Annotated[str | None, typer.Option(metavar="A,B",
                                                     help="comma list of policies (default: all)")] = None,
        out_dir: Annotated[Path | None, typer.Option("--out", metavar="DIR",
                                                     help="write result.json and table.md here")] = None,
        limit: Annotated[int | None, typer.Option(metavar="N", help="only the first N jobs")] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Replay a job trace through the same policy under several configurations."""
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from broker.sim.report import markdown, rich_table
        from broker.sim.run import simulate as run_sim

        names = [p.strip() for p in policies.split(",")] if policies else None
        with Progress(TextColumn("{task.description:<16}"), BarColumn(),
                      TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(), console=err(),
                      transient=as_json) as bar:
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
            print_json(result)
        else:
            out().print(rich_table(result))
