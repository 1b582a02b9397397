"""What `onepool submit` and `onepool status JOB` print about workloads that travel (issue 26):
what the client did with the job's code folder, and each attempt's restart phases."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from broker.phases import describe


def print_code_note(client: Any, err: Console) -> None:
    """The HTTP client's note on the folder it packed (uploaded, or stored already)."""
    note = getattr(client, "code_note", None)
    if note:
        err.print(note, highlight=False, markup=False, soft_wrap=True)


def print_phases(info: Any, out: Console) -> None:
    """One line per attempt that has restart phases: where its resume spent its time."""
    for a in info.attempt_list:
        if a.phases or a.restart_overhead_s is not None:
            out.print(f"attempt {a.number}: {describe(a.phases or {}, a.restart_overhead_s)}", markup=False)
