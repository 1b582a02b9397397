"""The contract between the broker and where work runs.

Errors say what the caller should do next:
- NoCapacity: this pool cannot take it now; try another pool.
- Transient: a blip (throttling, timeout, 5xx); retry the same call later with backoff.
- Fatal: retrying cannot help (bad credentials, bad request); give up and report.

An Executor runs the processes of one attempt, one per rank (node). Its contract:
- start() is idempotent per (attempt_id, rank): a second call returns the first process's
  handle instead of starting another, also after a broker crash (recover=True searches for
  a process started by a crashed broker before starting one).
- status() tells RUNNING, EXITED (with the exit code) or LOST (gone without an exit code).
- signal() of a process that is gone returns quietly.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol


class ProviderError(Exception):
    """Base of provider errors."""


class NoCapacity(ProviderError):
    """The pool has no capacity for this now: try another pool."""


class Transient(ProviderError):
    """A temporary failure: retry later, with backoff."""


class Fatal(ProviderError):
    """Retrying cannot help: give up and report it."""


class RankState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    LOST = "lost"


@dataclass(frozen=True)
class RankStatus:
    state: RankState
    exit_code: int | None = None


Handle = dict[str, Any]
"""A JSON-able record that lets any broker process find the rank's process again."""


class Executor(Protocol):
    def start(self, attempt_id: int, rank: int, argv: list[str], env: dict[str, str],
              *, recover: bool = False) -> Handle: ...

    def status(self, handle: Handle) -> RankStatus: ...

    def signal(self, handle: Handle, sig: int) -> None: ...
