"""A Slurm rank that cannot start says why and ends with its cause: the rank wrapper of the
batch script (providers.slurm.script), run by bash as srun runs it, and the executor's reading
of the exit status Slurm records (broker.control.slurm_exec)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.control.slurm_exec import SlurmExecutor
from providers.base import RankState
from providers.slurm import JobRecord
from providers.slurm.script import _RANK_SH


def executable(tmp: Path, name: str, text: str, mode: int = 0o755) -> str:
    path = tmp / name
    path.write_text(text)
    path.chmod(mode)
    return str(path)


# (name, (tmp) -> (argv, workdir or None), the cause, or None for a rank that started)
CASES: list[tuple[str, Callable[[Path], tuple[list[str], str | None]], str | None]] = [
    ("workdir-missing", lambda t: (["true"], str(t / "projct")), "start_failed:workdir_missing"),
    ("workdir-is-a-file", lambda t: (["true"], executable(t, "f", "x")),
     "start_failed:workdir_not_a_directory"),
    ("command-not-found", lambda t: (["onepool-no-such-command"], None), "start_failed:command_not_found"),
    ("path-not-found", lambda t: ([str(t / "train.py")], None), "start_failed:command_not_found"),
    ("not-executable", lambda t: ([executable(t, "run.sh", "#!/bin/sh\n", 0o644)], None),
     "start_failed:permission_denied"),
    ("bad-interpreter", lambda t: ([executable(t, "run.py", "#!/no/such/python3 -u\nprint(1)\n")], None),
     "start_failed:bad_interpreter"),
    ("started-and-failed", lambda t: (["sh", "-c", "exit 3"], str(t)), None),
    ("started-with-a-spaced-shebang", lambda t: ([executable(t, "ok.sh", "#! /bin/sh\nexit 0\n")], str(t)),
     None),
]


@pytest.mark.parametrize(("name", "make", "cause"), CASES, ids=[c[0] for c in CASES])
def test_a_slurm_rank_that_cannot_start_ends_with_its_cause(tmp_path: Path, name: str, make, cause):
    argv, workdir = make(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "SLURM_PROCID": "0", **({"ONEPOOL_WORKDIR": workdir} if workdir else {})}
    r = subprocess.run(["bash", "-c", _RANK_SH, "onepool-rank", *argv], env=env, capture_output=True,
                       text=True, timeout=10)
    rec = JobRecord("1", "FAILED" if r.returncode else "COMPLETED", exit_code=r.returncode)
    st = SlurmExecutor._ended(None, "1", rec)  # type: ignore[arg-type]  # (a cluster only for requeues)
    assert st.state == RankState.EXITED and st.cause == cause, (r.returncode, r.stderr)
    if cause is not None:
        assert "cannot start the rank on" in r.stderr and cause in r.stderr
