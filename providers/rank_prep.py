"""What a rank gets before its command runs (issue 26): its code snapshot as a private copy
(providers.code_cache) and its setup commands wrapped around its command
(providers.setup_runner). Used by providers.local.LocalProcesses for local pools and agents."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.checkpoint.localdisk import open_regular
from broker.checkpoint.names import BadName
from broker.codepack import SHA_ENV, URI_ENV
from broker.phases import clean
from providers.code_cache import CodeCache
from providers.data_cache import DATA_ENV, DataCache
from providers.image_pull import pull_image_seconds
from providers.isolation import User, owned_dirs
from providers.setup_runner import SETUP_ENV

MAX_SETUP_RECORD = 4096  # bytes of setup.json read (a few numbers)
PHASES_FILE = "phases.json"  # in the rank's run folder: what the node timed (broker.phases)
DATA_FILE = "data.json"  # in the rank's run folder: the data cache entries it links
AWAITS = "awaits"  # in PHASES_FILE: what is still to come ("pull": its image, "setup": its setup)
SETUP_RUNNER = str(Path(__file__).with_name("setup_runner.py"))
IMAGE_ENV = "ONEPOOL_IMAGE"  # the container image's name (issue 26 part 2): part of the setup digest


def checkout(cache: CodeCache, env: Mapping[str, str], job_dir: Path, user: User | None) -> Path | None:
    """The rank's private writable copy of its code snapshot, `job_dir/code`, owned by the
    rank's user; None when the rank has no snapshot. Raises StartFailed (providers.code_cache)."""
    digest = env.get(SHA_ENV)
    if not digest:
        return None
    dest = cache.checkout(digest, env.get(URI_ENV, ""), job_dir / "code")
    if user is not None:
        for root, dirs, files in os.walk(dest):
            for n in [*dirs, *files]:
                os.lchown(os.path.join(root, n), user.uid, user.gid)
        os.lchown(dest, user.uid, user.gid)
    return dest


def link_data(cache: DataCache, env: Mapping[str, str], cwd: Path, user: User | None) -> list[str]:
    """Link the rank's `data` (JSON in $ONEPOOL_DATA) into its working folder; the cache keys
    linked. Raises StartFailed."""
    raw = env.get(DATA_ENV)
    if not raw:
        return []
    mapping = json.loads(raw)
    keys = cache.link(mapping, cwd)
    if user is not None:
        for rel in mapping:
            os.lchown(cwd / rel, user.uid, user.gid)
    return keys


def data_in_use(runs_dir: Path) -> set[str]:
    """The data cache entries linked by the ranks under `runs_dir` that have not ended."""
    keys: set[str] = set()
    for f in runs_dir.glob(f"attempt-*/rank-*/{DATA_FILE}"):
        if not (f.parent / "exit.json").exists():
            with contextlib.suppress(OSError, ValueError):
                keys.update(json.loads(f.read_text()).get("keys", []))
    return keys


def setup_digest(env: Mapping[str, str]) -> str:
    """What makes a setup's effect on a node: the image, the code and the commands."""
    key = {"image": env.get(IMAGE_ENV), "code": env.get(SHA_ENV), "setup": json.loads(env[SETUP_ENV])}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def setup_prefix(env: Mapping[str, str], markers: Path, user: User | None) -> list[str]:
    """What runs the rank's setup commands before its command ([] without any). `markers`: the
    node's setup folder (one subfolder per rank user, theirs: a team's markers are its own)."""
    if not env.get(SETUP_ENV):
        return []
    markers.mkdir(parents=True, exist_ok=True)
    os.chmod(markers, 0o711)
    name = str(user.uid) if user is not None else "self"
    owned_dirs(markers, [name], user)
    return [sys.executable, "-I", SETUP_RUNNER, str(markers / name), setup_digest(env), "--"]


def image_setup(env: Mapping[str, str], markers: Path) -> dict[str, Any] | None:
    """The setup of a rank with an image (None without one): its commands, its digest, and the
    lock file under which the rank's supervisor builds (or finds) the derived image
    (providers.container.run_setup). The host's setup runner cannot run inside an image."""
    if not env.get(SETUP_ENV) or not env.get(IMAGE_ENV):
        return None
    folder = markers / "images"
    folder.mkdir(parents=True, exist_ok=True)
    digest = setup_digest(env)
    return {"commands": json.loads(env[SETUP_ENV]), "digest": digest, "lock": str(folder / f"{digest}.lock")}


@dataclass(frozen=True)
class Prepared:
    cwd: str | None  # where the rank runs (None: its job folder)
    argv_prefix: list[str]  # put before its command (its setup, without an image)
    phases: dict[str, Any]  # written to PHASES_FILE (with AWAITS)
    image_setup: dict[str, Any] | None = None  # its setup, with an image (see image_setup)
    data_keys: list[str] = field(default_factory=list)  # the data cache entries it links (in use)


def prepare(code: CodeCache, data: DataCache, env: Mapping[str, str], job_dir: Path, user: User | None,
            *, workdir: str | None, markers: Path) -> Prepared:
    """Everything a rank needs before its command, timed: its code copy (unless it has a
    `workdir`), its data links, its setup. Raises StartFailed."""
    phases: dict[str, float | bool] = {}
    data_keys: list[str] = []
    cwd = workdir
    if env.get(SHA_ENV) and cwd is None:
        t = time.monotonic()
        copy = checkout(code, env, job_dir, user)
        phases["fetch_code_s"] = round(time.monotonic() - t, 3)
        cwd = str(copy) if copy is not None else None
    if env.get(DATA_ENV):
        t = time.monotonic()
        data_keys = link_data(data, env, Path(cwd or job_dir), user)
        phases["fetch_data_s"] = round(time.monotonic() - t, 3)
    in_image = image_setup(env, markers)
    prefix = [] if in_image is not None else setup_prefix(env, markers, user)
    awaits = [*(["pull"] if env.get(IMAGE_ENV) else []), *(["setup"] if prefix or in_image else [])]
    if awaits:  # until the supervisor recorded its pull, the setup runner its time (read_phases)
        phases["pending"] = True
    return Prepared(cwd, prefix, {**phases, **({AWAITS: awaits} if awaits else {})}, in_image, data_keys)


def read_phases(run_dir: Path, job_dir: Path) -> dict[str, float | bool] | None:
    """The phases the node timed: its image's pull (providers.image_pull), and the setup's time
    once its runner wrote it (an image's: in the run folder, by the supervisor; else in the
    job's folder, written as the job's user, so only its known fields are kept:
    broker.phases.clean)."""
    try:
        got = json.loads((run_dir / PHASES_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not got.get("pending"):
        return clean(got)
    awaits = got.get(AWAITS, ["setup"])
    left = set(awaits)
    pulled = pull_image_seconds(run_dir)
    if pulled is not None:
        got["pull_image_s"] = pulled
        left.discard("pull")
    setup = None
    for where in (run_dir, job_dir) if "setup" in awaits else ():
        try:  # the job's folder is the job's: a FIFO, a link or a huge file there is refused
            with open_regular(str(where / "setup.json")) as f:
                setup = json.loads(f.read(MAX_SETUP_RECORD))
            break
        except (OSError, ValueError, BadName):
            continue
    if isinstance(setup, dict):
        got = {**got, "setup_s": setup.get("setup_s"), "setup_cached": setup.get("cached")}
        left.discard("setup")
    return clean({**got, "pending": bool(left)})
