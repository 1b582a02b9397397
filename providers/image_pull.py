"""Pulling a rank's image before its container starts, timed: the attempt's `pull_image`
phase (issue 26). Standard library only: the rank's supervisor (providers.local_runner) runs it.

The supervisor pulls once per rank: an image the node holds already costs a lookup (cached);
else `pull`, bounded by ONEPOOL_PULL_TIMEOUT_S (default 1800 s). The time goes to the rank's
folder (`image.json`: image, pull_image_s, cached) and one line of its log;
`pull_image_seconds(run_dir)` reads it back for the phase timings.

An image that cannot be pulled ends the attempt as a start failure (providers.start_errors):
- `image_not_found`: the registry says it has no such image or tag (or the reference is
  malformed for the runtime): the job's fault, so it fails at once, never retried;
- `image_pull_failed`: anything else (registry unreachable, the node lacks credentials, a
  timeout): the node may be at fault, so the job is tried on other nodes, at most
  `broker.max_start_failures` times, then fails with that cause.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

PULL_FILE = "image.json"
TIMEOUT_ENV = "ONEPOOL_PULL_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800.0
LOOKUP_TIMEOUT_S = 60.0
# What podman and docker print when the registry has no such image: the job's mistake.
NOT_FOUND = ("manifest unknown", "name unknown", "not found", "does not exist", "no such image",
             "invalid reference format", "repository name must")


@dataclass(frozen=True)
class Pulled:
    """An image ready on this node: how long getting it took, and whether it was there."""

    image: str
    seconds: float
    cached: bool


class PullFailed(Exception):
    """The image could not be pulled: `kind` is image_not_found or image_pull_failed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def pull_image(cli: str, kind: str, image: str, env: Mapping[str, str], *,
               timeout_s: float | None = None,
               clock: Callable[[], float] = time.monotonic) -> Pulled:
    """Make `image` present on this node with the runtime `cli` (dialect `kind`: podman or
    docker). Raises PullFailed with the runtime's own words."""
    if timeout_s is None:
        timeout_s = float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S)
    t0 = clock()
    lookup = [cli, "image", "exists" if kind == "podman" else "inspect", image]
    try:
        held = subprocess.run(lookup, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=LOOKUP_TIMEOUT_S,
                              preexec_fn=deaf_to_usr1).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PullFailed("image_pull_failed", f"cannot ask {cli} for the image: {e}") from e
    if held:
        return Pulled(image, clock() - t0, cached=True)
    try:
        r = subprocess.run([cli, "pull", image], env=dict(env), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout_s,
                           preexec_fn=deaf_to_usr1)
    except subprocess.TimeoutExpired as e:
        raise PullFailed("image_pull_failed", f"pulling {image} took longer than {timeout_s:g}s "
                         f"({TIMEOUT_ENV})") from e
    except OSError as e:
        raise PullFailed("image_pull_failed", f"cannot run {cli}: {e}") from e
    if r.returncode != 0:
        said = r.stderr.decode(errors="replace").strip().splitlines()
        last = said[-1] if said else f"exit status {r.returncode}"
        why = "image_not_found" if any(s in last.lower() for s in NOT_FOUND) else "image_pull_failed"
        raise PullFailed(why, f"cannot pull {image}: {last[:400]}")
    return Pulled(image, clock() - t0, cached=False)


def deaf_to_usr1() -> None:
    """In the pull's process: SIGUSR1 ("checkpoint now", sent to the rank's whole group) would
    end it; ignored, it stays ignored across exec. SIGTERM still stops it (the rank is stopped)."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def record(run_dir: Path, pulled: Pulled) -> None:
    """Write the rank's `image.json` (atomically)."""
    tmp = run_dir / (PULL_FILE + ".tmp")
    tmp.write_text(json.dumps({"image": pulled.image, "pull_image_s": round(pulled.seconds, 4),
                               "cached": pulled.cached}))
    tmp.replace(run_dir / PULL_FILE)


def pull_image_seconds(run_dir: Path) -> float | None:
    """The `pull_image` phase of a rank (seconds), None if it ran no image or has not pulled."""
    try:
        return float(json.loads((run_dir / PULL_FILE).read_text())["pull_image_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


LIST_FORMAT = "{{.Repository}}:{{.Tag}} {{.Repository}}@{{.Digest}}"  # podman's and docker's template


MAX_REPORTED = 256  # references an agent reports (the sync's limit), each at most 512 characters


def parse_images(text: str) -> list[str]:
    """The references in `images --format LIST_FORMAT` output, without the `<none>` ones, each
    once, in the runtime's order (newest first), at most MAX_REPORTED."""
    refs = (r for line in text.splitlines() for r in line.split())
    return list(dict.fromkeys(r for r in refs if "<none>" not in r and len(r) <= 512))[:MAX_REPORTED]


class HeldImages:
    """What this node's container runtime holds (issue 26: agents report it, the policy prefers
    nodes holding a job's image), asked at most every `every_s` seconds (a listing costs a
    runtime process). `ask()` gives (cli, kind, env) of the runtime, or None when this node has
    none: then `get()` is None (nothing to report)."""

    def __init__(self, ask: Callable[[], tuple[str, str, Mapping[str, str]] | None], every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ask, self.every_s, self.clock = ask, every_s, clock
        self._at: float | None = None
        self._held: list[str] | None = None

    def get(self) -> list[str] | None:
        now = self.clock()
        if self._at is not None and now - self._at < self.every_s:
            return self._held
        self._at = now
        rt = self.ask()
        if rt is None:
            self._held = None
            return None
        cli, _kind, env = rt
        try:
            r = subprocess.run([cli, "images", "--format", LIST_FORMAT], env=dict(env),
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=LOOKUP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return self._held  # (the last answer: tried again after every_s)
        if r.returncode == 0:
            self._held = parse_images(r.stdout.decode(errors="replace"))
        return self._held
