"""`onepool submit`, `status`, `cancel` and `events` over HTTP, started fast (issue 27): the command line
parsed with argparse, the answers read by broker.client.thin.ThinClient as the server's JSON
and printed by the same code as the typer app's (broker.client.cli_jobs), with nothing of
typer, pydantic, broker.wire or the server imported. Typer builds a pydantic adapter per option
of the command it runs, and pydantic with the models costs more than the rest of the command.

`fast_command(argv)` answers None, and the typer app (broker.client.cli_app) runs the command
line instead, whenever this path would not do exactly what the app does: no ONEPOOL_URL (a
home on this machine), another command, --help, an option the fast path does not take
(submit --dry-run, status --array or --estimate, cancel --array), or a mistake the app
explains (a bad value, a missing argument). The options here are the app's
(tests/test_cli_fast.py compares them).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from broker.client.cli_jobs import STATUS_LIMIT

if TYPE_CHECKING:
    from broker.client.thin import ThinClient


class NotFast(Exception):
    """This command line is the typer app's to run (see the module)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise NotFast(message)


def _submit_parser() -> _Parser:
    p = _Parser(prog="onepool submit", add_help=False, allow_abbrev=False)
    p.add_argument("-f", "--file", type=Path)
    for name in ("--name", "--team", "--experiment", "--priority", "--spot", "--array", "--deadline",
                 "--image", "--code", "--checkpoint-interval-s"):
        p.add_argument(name)
    p.add_argument("--budget-usd", type=float)
    p.add_argument("--gpus", type=int)
    p.add_argument("--nodes", type=int)
    for name in ("--gpu-type", "--env", "--after", "--setup"):
        p.add_argument(name, action="append")
    p.add_argument("--json", dest="as_json", action="store_true")
    return p


def _status_parser() -> _Parser:
    p = _Parser(prog="onepool status", add_help=False, allow_abbrev=False)
    p.add_argument("job", nargs="?", type=int)
    p.add_argument("--status", "--state", dest="state", action="append")
    p.add_argument("--team")
    p.add_argument("--user")
    p.add_argument("--all", dest="all_", action="store_true")
    p.add_argument("--limit", type=int, default=STATUS_LIMIT)
    p.add_argument("--json", dest="as_json", action="store_true")
    return p


def _job_parser(command: str, job_required: bool, *options: str) -> _Parser:
    p = _Parser(prog=f"onepool {command}", add_help=False, allow_abbrev=False)
    p.add_argument("job", nargs=None if job_required else "?", type=int)
    for name in options:
        p.add_argument(name)
    p.add_argument("--json", dest="as_json", action="store_true")
    return p


PARSERS: dict[str, Callable[[], _Parser]] = {
    "submit": _submit_parser, "status": _status_parser, "cancel": lambda: _job_parser("cancel", True),
    "events": lambda: _job_parser("events", False, "--user")}


def _client() -> ThinClient:
    from broker.client.thin import ThinClient

    return ThinClient(os.environ["ONEPOOL_URL"], os.environ.get("ONEPOOL_TOKEN"))


def _submit(args: list[str]) -> Callable[[], None]:
    cut = args.index("--") if "--" in args else len(args)
    a = PARSERS["submit"]().parse_args(args[:cut])
    command = args[cut + 1:]

    def run() -> None:
        from broker.client.cli_jobs import submit_and_print, submit_data

        flags = {"name": a.name, "team": a.team, "experiment": a.experiment, "priority": a.priority,
                 "budget_usd": a.budget_usd, "gpus_per_node": a.gpus, "nodes": a.nodes,
                 "gpu_types": a.gpu_type, "spot": a.spot, "checkpoint_interval_s": a.checkpoint_interval_s,
                 "deadline": a.deadline, "command": command or None, "array": a.array, "after": a.after,
                 "image": a.image, "code": a.code, "setup": a.setup}
        data = submit_data(a.file, flags, a.env, over_http=True)
        with _client() as c:
            submit_and_print(c, data, a.as_json)

    return run


def _status(args: list[str]) -> Callable[[], None]:
    a = PARSERS["status"]().parse_args(_no_dashes(args))
    if not 1 <= a.limit <= 1000:
        raise NotFast("--limit")  # the app says which range

    def run() -> None:
        from broker.client.cli_jobs import show_job, show_jobs

        with _client() as c:
            if a.job is not None:
                show_job(c, a.job, a.as_json)
            else:
                show_jobs(c, a.state, a.team, a.all_, a.limit, None, False, a.as_json, _client, a.user)

    return run


def _cancel(args: list[str]) -> Callable[[], None]:
    a = PARSERS["cancel"]().parse_args(_no_dashes(args))

    def run() -> None:
        from broker.client.cli_jobs import cancel_and_print

        with _client() as c:
            cancel_and_print(c, a.job, a.as_json)

    return run


def _events(args: list[str]) -> Callable[[], None]:
    a = PARSERS["events"]().parse_args(_no_dashes(args))

    def run() -> None:
        from broker.client.cli_jobs import show_events

        with _client() as c:
            show_events(c, a.job, a.as_json, a.user)

    return run


def _no_dashes(args: list[str]) -> list[str]:
    if "--" in args:  # a JOB after --: the app's to parse
        raise NotFast("--")
    return args


COMMANDS: dict[str, Callable[[list[str]], Callable[[], None]]] = {
    "submit": _submit, "status": _status, "cancel": _cancel, "events": _events}


def fast_command(argv: list[str]) -> Callable[[], None] | None:
    """The command `argv` (sys.argv[1:]) names, ready to run on the fast path, or None when the
    typer app must run it (see the module). Parsing only: nothing is sent yet."""
    if not os.environ.get("ONEPOOL_URL"):
        return None
    i = 0
    # the app's one global option, --home DIR, is not used over HTTP
    while i < len(argv) and (argv[i] == "--home" or argv[i].startswith("--home=")):
        i += 1 if argv[i].startswith("--home=") else 2
    if i >= len(argv) or argv[i] not in COMMANDS:
        return None
    mine = argv[:argv.index("--")] if "--" in argv else argv
    if any(a[:1] == "-" and a[1:2].isdigit() for a in mine):  # click reads -1 as an option, argparse
        return None  # as a number: the app's to say
    try:
        return COMMANDS[argv[i]](argv[i + 1:])
    except NotFast:
        return None
