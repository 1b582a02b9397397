"""`onepool ...`: the console script's entry point (`onepool = broker.client.cli:main`).

Over HTTP (ONEPOOL_URL), `onepool submit`, `status`, `cancel` and `events` run through
broker.client.cli_fast: argparse, the server's JSON read as it is, nothing of typer, pydantic
or the server imported (issue 27: a CLI that starts fast; tests/test_cli_fast.py keeps it so).
Every other command line, and these with an option only the full CLI knows (--help,
--dry-run, --estimate, --array) or a mistake to explain, goes to the typer app,
broker.client.cli_app, where the commands are defined and registered; `app` and the rest of its
names are readable here too (`from broker.client.cli import app`).
"""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    from broker.client.cli_fast import fast_command

    command = fast_command(sys.argv[1:])
    if command is not None:
        from broker.client.cli_out import reporting_errors

        reporting_errors(command)
        return
    from broker.client.cli_app import main as run_app

    run_app()


def __getattr__(name: str) -> Any:  # `from broker.client.cli import app`: the typer app, loaded on use
    if name.startswith("__"):  # what the import system asks of a module (__path__, ...)
        raise AttributeError(name)
    from broker.client import cli_app

    return getattr(cli_app, name)


if __name__ == "__main__":
    main()
