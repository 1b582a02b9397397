"""What `onepool` commands print, without typer (issue 27: a CLI that starts fast): the
consoles (rich, imported on first use), tables, times, the JSON printer, the jobs table and the
"no broker" warning. Shared by the typer app (broker.client.cli_app) and the HTTP fast path
(broker.client.cli_fast), so both print the same thing.

Rows are read by attribute only, so a JobInfo of the SDK and a broker.client.views.View of
the server's JSON print alike.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.errors import SERVER_MODULES, OnepoolError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from broker.state.views import JobInfo


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


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _opt(v: int | None) -> str:
    return "" if v is None else str(v)


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


def reporting_errors(run: Callable[[], object]) -> None:
    """Call `run` (a command); an error the user can fix (OnepoolError, or a server part not
    installed here) prints one line on stderr and exits with status 2, a TimeoutError with 3.
    Anything else is a bug and shows its traceback."""
    try:
        run()
    except OnepoolError as e:
        _err().print(f"[red]error:[/red] {_esc(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except ModuleNotFoundError as e:  # the thin client (`pip install onepool`) running a server command
        if (e.name or "").split(".")[0] not in SERVER_MODULES:
            raise
        msg = (f"this command needs onepool's server parts ({e.name} is not installed here): run "
               "`pip install 'onepool[server]'`")
        _err().print(f"[red]error:[/red] {_esc(msg)}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except TimeoutError as e:
        _err().print(f"[red]timeout:[/red] {_esc(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(3)
