"""What a rank gets before its command runs (issue 26): its code snapshot as a private copy
(providers.code_cache) and its setup commands wrapped around its command
(providers.setup_runner). Used by providers.local.LocalProcesses for local pools and agents."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from broker.codepack import SHA_ENV, URI_ENV
from providers.code_cache import CodeCache
from providers.data_cache import DATA_ENV, DataCache
from providers.isolation import User, owned_dirs
from providers.setup_runner import SETUP_ENV

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


def link_data(cache: DataCache, env: Mapping[str, str], cwd: Path, user: User | None) -> None:
    """Link the rank's `data` (JSON in $ONEPOOL_DATA) into its working folder. Raises StartFailed."""
    raw = env.get(DATA_ENV)
    if not raw:
        return
    mapping = json.loads(raw)
    cache.link(mapping, cwd)
    if user is not None:
        for rel in mapping:
            os.lchown(cwd / rel, user.uid, user.gid)


def setup_digest(env: Mapping[str, str]) -> str:
    """What makes a setup's effect on a node: the image, the code and the commands."""
    key = {"image": env.get(IMAGE_ENV), "code": env.get(SHA_ENV), "setup": json.loads(env[SETUP_ENV])}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def with_setup(argv: list[str], env: Mapping[str, str], markers: Path, user: User | None) -> list[str]:
    """`argv` run after the rank's setup commands (unchanged without any). `markers`: the
    node's setup folder (one subfolder per rank user, theirs: a team's markers are its own)."""
    if not env.get(SETUP_ENV):
        return argv
    markers.mkdir(parents=True, exist_ok=True)
    os.chmod(markers, 0o711)
    name = str(user.uid) if user is not None else "self"
    owned_dirs(markers, [name], user)
    return [sys.executable, "-I", SETUP_RUNNER, str(markers / name), setup_digest(env), "--", *argv]
