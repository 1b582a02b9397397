"""A mypyc-compiled copy of the policy and the simulator, for the benchmarks' `--compiled`.

The same source, compiled to C by mypyc (the compiler mypy and black ship with): broker/policy
and broker/sim's replay core (simulator, world, state, metrics, setup, rebalance). mypyc enforces the
type hints at run time, so a hint that lies fails loudly instead of replaying differently;
`make lint` keeps both packages `mypy --strict` clean so they stay compilable.

The copy lives under build/mypyc/<key>/, where key hashes every .py of broker/, providers/ and
pricing/, pyproject.toml and the mypy version: an edit makes a new build, never a stale one.
A build is made in a temporary directory and renamed into place when complete, so a failed or
interrupted build leaves nothing half-written that a later run would use.

    sys.path.insert(0, compiled.import_root(sys.argv))  # a bench script, before importing broker

With `--compiled` in argv it builds (or reuses) the copy and replaces the process with the same
script run on it (ONEPOOL_COMPILED names the copy); it returns the directory to import from.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "providers", "pricing")
MODULES = ("broker/policy/", "broker/sim/simulator.py", "broker/sim/world.py", "broker/sim/state.py",
           "broker/sim/metrics.py", "broker/sim/setup.py", "broker/sim/rebalance.py")
ENV = "ONEPOOL_COMPILED"


class CompileError(RuntimeError):
    """mypyc could not build the copy: run without --compiled (the pure-Python code is the
    same), or read the log it names."""


def mypyc_version() -> str:
    from mypy.version import __version__

    return f"mypyc {__version__}"


def source_key(repo: Path = REPO) -> str:
    """A hash of everything the build depends on: every .py of the packages, pyproject.toml,
    and the mypy version."""
    h = hashlib.sha256(mypyc_version().encode())
    files = sorted(p for pkg in PACKAGES for p in (repo / pkg).rglob("*.py"))
    for p in [*files, repo / "pyproject.toml"]:
        h.update(str(p.relative_to(repo)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build(repo: Path = REPO) -> Path:
    """The compiled copy's root (to put first on sys.path), built if missing.

    Raises CompileError when mypyc fails; its output is kept in build/mypyc/<key>.log."""
    root = repo / "build" / "mypyc"
    key = source_key(repo)
    dest = root / key
    if (dest / "BUILT").exists():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{key}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for pkg in PACKAGES:
        shutil.copytree(repo / pkg, tmp / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy2(repo / "pyproject.toml", tmp / "pyproject.toml")
    log = root / f"{key}.log"
    print(f"compiling {', '.join(MODULES)} with {mypyc_version()} into {dest} "
          "(once per source version; about 2 minutes on 2 cores)", flush=True)
    t0 = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.call([sys.executable, "-m", "mypyc", *MODULES], cwd=tmp,
                             stdout=out, stderr=subprocess.STDOUT)
    if rc != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CompileError(f"mypyc failed (exit {rc}); its output is in {log}. Run without "
                           "--compiled to use the pure-Python code.")
    shutil.rmtree(tmp / "build", ignore_errors=True)
    (tmp / "BUILT").write_text(f"{mypyc_version()}\n")
    try:
        tmp.rename(dest)
    except OSError:  # another run finished the same build first
        if not (dest / "BUILT").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"compiled in {time.perf_counter() - t0:.0f} s", flush=True)
    return dest


def import_root(argv: list[str]) -> str:
    """The directory to put first on sys.path: the compiled copy when this process runs on
    it, else the repository. With --compiled in argv (and not yet on the copy) it builds the
    copy, then execs this script again on it without the flag, and does not return; a failed
    build exits with the error."""
    if "--compiled" in argv and not os.environ.get(ENV):
        try:
            dest = build()
        except CompileError as e:
            sys.exit(f"error: {e}")
        args = [a for a in argv if a != "--compiled"]
        os.execve(sys.executable, [sys.executable, *args], {**os.environ, ENV: str(dest)})
    return os.environ.get(ENV) or str(REPO)


def label() -> str | None:
    """What the figures were measured on, for the results: the mypyc version, or None for
    pure Python."""
    return mypyc_version() if os.environ.get(ENV) else None
