"""`onepool logs JOB [-f]`: a job's output, embedded or over HTTP (the same client methods).

With -f it follows the job until it ends: a job that has not started yet is waited for (one
line on stderr says so, and why it waits when the broker knows), and over HTTP a server that
stops answering (a restart, an outage) is waited for too: the calls are retried with backoff
until it answers again, and the output continues from the byte offset already printed, so
nothing is printed twice. An answer that refuses the request (no such job, a revoked token:
a 4xx other than 429) ends the command with that error.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from broker.client.waits import STOPPED
from broker.errors import TooManyRequests, Unavailable

T = TypeVar("T")
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 5.0)  # waits between tries while the server does not answer


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@dataclass
class Follower:
    """Prints one rank's output; `say` writes a note on stderr, `sleep` waits (injected in tests)."""

    client: Any
    job: int
    attempt: int | None
    rank: int
    say: Callable[[str], None]
    sleep: Callable[[float], None] = time.sleep
    poll_s: float = 0.5
    write: Callable[[str], None] = _stdout
    _down_since: float | None = None

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)`, retried with backoff while the server does not answer (Unavailable);
        one note when it stops answering and one when it answers again; after a 429, retried
        when it says. Any other error (a 4xx answer: NotFound, Unauthorized, ...) is raised
        as is."""
        tries = 0
        while True:
            try:
                got = fn(*args)
            except TooManyRequests as e:  # a 4xx that says when to come back
                self.say(f"[onepool: {e}; retrying in {e.retry_after_s}s]")
                self.sleep(float(e.retry_after_s))
                continue
            except Unavailable as e:
                if self._down_since is None:
                    self._down_since = time.monotonic()
                    self.say(f"[onepool: {e}; retrying until it answers (Ctrl-C stops)]")
                self.sleep(BACKOFF_S[min(tries, len(BACKOFF_S) - 1)])
                tries += 1
                continue
            if self._down_since is not None:
                down_s = time.monotonic() - self._down_since
                self.say(f"[onepool: the server answers again (after {down_s:.0f}s); continuing]")
                self._down_since = None
            return got

    def wait_started(self) -> bool:
        """Wait until the job has an attempt; one note per distinct reason it waits. False when
        it ended without starting (said on stderr). Raises NotFound for a job that does not
        exist (or that the token may not see)."""
        said: str | None = None
        while True:
            info = self.call(self.client.get, self.job)
            if info.attempts > 0:
                return True
            if info.status in STOPPED:
                self.say(f"[onepool: job {self.job} ended {info.status} without starting: no output]")
                return False
            why = info.waiting_reason or "the broker has not placed it yet"
            if why != said:
                self.say(f"[onepool: job {self.job} is {info.status}, waiting for it to start: {why}]")
                said = why
            self.sleep(self.poll_s)

    def run(self, follow: bool) -> None:
        """Print the output (every attempt from the chosen one on, with -f) until the job ends."""
        if follow and not self.wait_started():
            return
        c, rank = self.client, self.rank
        asked, chunk = 0, self.call(c.logs, self.job, self.attempt, rank)
        while True:
            if chunk.offset > asked:
                self.say(f"[onepool: {chunk.offset - asked} bytes of output dropped here (over the "
                         "attempt's output cap; the tail is kept)]")
            self.write(chunk.data)
            if chunk.data:
                asked, chunk = chunk.next_offset, self.call(c.logs, self.job, chunk.attempt, rank,
                                                            chunk.next_offset)
                continue
            if not follow:
                return
            if chunk.attempt_ended:
                info = self.call(c.get, self.job)
                if self.attempt is None and info.attempts > chunk.attempt:
                    self.say(f"--- attempt {chunk.attempt + 1} ---")
                    asked, chunk = 0, self.call(c.logs, self.job, chunk.attempt + 1, rank)
                    continue
                if self.attempt is not None or info.status in STOPPED:
                    return
            self.sleep(self.poll_s)
            asked, chunk = chunk.next_offset, self.call(c.logs, self.job, chunk.attempt, rank,
                                                        chunk.next_offset)
