"""`onepool replay`: replay this broker's own history under its config and under changed
settings, and print the differences (issue 31). Registered on the main app like the money
commands. On the home's database, or over HTTP (ONEPOOL_URL, an admin token: POST
/v1/replay).

    onepool replay --set broker.grace_s=120 --set teams.nlp.weight=2 [--since 7d] [--json]
    onepool replay -c other.yaml                 # the history under another onepool.yaml
    onepool replay --export DIR                  # trace.csv + scenario.yaml for `onepool simulate`
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.errors import SpecError

if TYPE_CHECKING:
    from rich.console import Console


def register(app: typer.Typer, client: Callable[[], Any], console: Callable[[], Console],
             print_json: Callable[[Any], None]) -> None:
    @app.command()
    def replay(
        sets: Annotated[list[str] | None, typer.Option(
            "--set", metavar="PATH=VALUE", help="a changed setting of onepool.yaml, e.g. broker.grace_s=120 "
            "or teams.nlp.weight=2 (repeatable)")] = None,
        config: Annotated[Path | None, typer.Option(
            "-c", "--config", metavar="FILE",
            help="compare with this onepool.yaml (--set applies on top)")] = None,
        since: Annotated[str | None, typer.Option(
            metavar="WHEN", help="only jobs submitted since: epoch s, ISO date, or 7d/12h/30m")] = None,
        export: Annotated[Path | None, typer.Option(
            "--export", metavar="DIR", help="write the history as trace.csv and scenario.yaml "
            "(for `onepool simulate`) instead of replaying")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the whole result as JSON")] = False,
    ) -> None:
        """Replay the history under the current config and changed settings; print the differences."""
        from broker.client.cli_money import parse_since
        from broker.spec import read_yaml

        when = parse_since(since)
        if export is not None:
            _export(client(), export, when, console())
            return
        if not sets and config is None:
            raise SpecError("replay", ["--set or --config: give a setting to change (e.g. --set "
                                       "broker.grace_s=120) or another onepool.yaml to compare with"])
        other = read_yaml(config) if config is not None else None
        if other is not None and not isinstance(other, dict):
            raise SpecError(str(config), ["(root): must be a mapping with 'pools' and 'teams'"])
        out = client().replay(list(sets or []), other, when)
        if as_json:
            print_json(out)
            return
        _show(out, console())


def _export(c: Any, folder: Path, since: float | None, out: Console) -> None:
    """Write the home's history as trace.csv and scenario.yaml (embedded homes only)."""
    import yaml

    from broker.control.config_apply import applied_config
    from broker.sim.replay import scenario_of
    from broker.sim.trace import write_trace
    from broker.state.history import export, prices

    store = getattr(c, "store", None)
    if store is None:
        raise SpecError("--export", ["export: reads the home's database; unset ONEPOOL_URL and give "
                                     "--home (over HTTP, `onepool replay --json` returns the comparison)"])
    c.principal.require_admin("exporting the broker's history (every team's jobs)")
    with store.session() as s:
        cfg = applied_config(s)
        now = c.clock.now()
        hist = export(s, cfg, now, since)
        sc = scenario_of(cfg, hist.trace, prices(s, hist.since, now), "history",
                         hist.checkpoint_interval_s)
    folder.mkdir(parents=True, exist_ok=True)
    write_trace(folder / "trace.csv", hist.trace)
    (folder / "scenario.yaml").write_text(yaml.safe_dump(sc.model_dump(mode="json", exclude_defaults=True),
                                                         sort_keys=False))
    out.print(f"wrote {len(hist.trace)} jobs to {folder / 'trace.csv'} and the scenario to "
              f"{folder / 'scenario.yaml'}", markup=False)


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "s":
        return f"{v / 60:.1f} min" if abs(v) >= 60 else f"{v:.0f} s"
    if unit == "usd":
        return f"${v:,.2f}"
    return f"{v:,.2f}" if isinstance(v, float) else str(v)


def _show(out: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    from broker.sim.compare import table

    t = Table("", "recorded", "replay: current", "replay: changed", "change",
              title=f"{out['jobs']} jobs replayed")
    for r in table(out):
        d = r["change"]
        t.add_row(r["what"], _fmt(r["recorded"], r["unit"]), _fmt(r["current"], r["unit"]),
                  _fmt(r["changed"], r["unit"]), ("+" if d and d > 0 else "") + _fmt(d, r["unit"]))
    console.print(t)
