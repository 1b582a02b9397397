"""The Slurm commands onepool uses, over one Runner: capacity, this user's jobs, submit,
signal, cancel, and what became of a job that left the queue.

Each method runs one command (two for `record()` when the first has forgotten the job) and
raises what the runner raises: SlurmUnreachable (retry later) or SlurmRejected (Slurm said
no). Parse problems raise SlurmParseError.
"""

from __future__ import annotations

import logging
import re

from providers.slurm.parse import (
    SACCT_FORMAT,
    SINFO_FORMAT,
    SQUEUE_FORMAT,
    JobRecord,
    SlurmJob,
    SlurmNode,
    SlurmParseError,
    parse_job_line,
    parse_jobcomp,
    parse_sacct,
    parse_sinfo,
    parse_squeue,
)
from providers.slurm.runner import Runner, SlurmRejected

log = logging.getLogger("onepool.slurm")


class SlurmCluster:
    """One partition of a Slurm cluster, reached through `runner`.

    `jobcomp_log`: the path of the jobcomp/filetxt log (JobCompLoc) where accounting is off,
    read when a job has left slurmctld's memory (after MinJobAge) and sacct cannot tell.
    """

    def __init__(self, runner: Runner, partition: str, *, jobcomp_log: str | None = None) -> None:
        self.runner = runner
        self.partition = partition
        self.jobcomp_log = jobcomp_log
        self._sacct = True  # until sacct says accounting is off

    @property
    def where(self) -> str:
        return self.runner.where

    def nodes(self) -> list[SlurmNode]:
        """The partition's nodes with their state and GRES (total and in use by anyone)."""
        out = self.runner.run(["sinfo", "-N", "-h", "-p", self.partition, "-O", SINFO_FORMAT])
        return parse_sinfo(out)

    def jobs(self) -> list[SlurmJob]:
        """Every job of the user onepool submits as, in any state slurmctld still holds
        (ended ones stay for MinJobAge, 300 s by default)."""
        return parse_squeue(self.runner.run(["squeue", "--me", "-h", "-t", "all", "-O", SQUEUE_FORMAT]))

    def submit(self, script: str, output_dir: str) -> str:
        """Make `output_dir` (sbatch does not create the folder of --output), then sbatch the
        script (read from stdin); returns the job id. SlurmRejected names what Slurm refused
        (a bad account, QOS, partition or request)."""
        self.runner.run(["mkdir", "-p", output_dir])
        out = self.runner.run(["sbatch", "--parsable"], stdin=script).strip()
        m = re.match(r"^(\d+)(;\S+)?$", out.splitlines()[-1] if out else "")
        if m is None:
            raise SlurmParseError(f"sbatch printed no job id: {out!r}")
        return m[1]

    def find(self, name: str) -> str | None:
        """The id of this user's newest job named `name`: in squeue, else in accounting or the
        jobcomp log. None: no such job was ever submitted (as far as Slurm remembers)."""
        out = self.runner.run(["squeue", "--me", "-h", "-t", "all", "--name", name, "-O", "JobID:|"])
        ids = [line.strip().rstrip("|") for line in out.splitlines() if line.strip()]
        if ids:
            return max(ids, key=int)
        if self._sacct:
            recs = self._sacct_records(["--name", name])
            if recs:
                return max((r.job_id for r in recs), key=int)
        if self.jobcomp_log:
            out = self.runner.run(["grep", "-a", "-e", f" Name={name} ", self.jobcomp_log], ok_codes=(0, 1))
            ids = [parse_job_line(line).job_id for line in out.splitlines() if line.strip()]
            if ids:
                return max(ids, key=int)
        return None

    def record(self, job_id: str) -> JobRecord | None:
        """State, exit code and restarts of a job, also one that has ended and left squeue:
        `scontrol show job`, else sacct, else the jobcomp log. None if none of them knows it."""
        try:
            out = self.runner.run(["scontrol", "-o", "show", "job", job_id])
            lines = [line for line in out.splitlines() if line.strip()]
            if lines:
                return parse_job_line(lines[0])
        except SlurmRejected as e:
            if "invalid job id" not in str(e).lower():
                raise
        if self._sacct:
            recs = self._sacct_records(["-j", job_id])
            if recs:
                return recs[-1]
        if self.jobcomp_log:
            out = self.runner.run(["grep", "-a", "-e", f"^JobId={job_id} ", self.jobcomp_log],
                                  ok_codes=(0, 1))
            return parse_jobcomp(out, job_id)
        return None

    def _sacct_records(self, select: list[str]) -> list[JobRecord]:
        try:
            out = self.runner.run(["sacct", "-n", "-P", "-X", "-D", *select, "-o", SACCT_FORMAT])
        except SlurmRejected as e:
            if "disabled" in str(e).lower() or "accounting_storage/none" in str(e).lower():
                self._sacct = False  # accounting is off: the jobcomp log (if any) is the record
                log.info("slurm on %s: accounting is off; ended jobs are read from %s",
                         self.where, self.jobcomp_log or "nowhere (set slurm.jobcomp_log)")
                return []
            raise
        return parse_sacct(out)

    def ranks_started(self, job_id: str) -> bool:
        """Whether the job's srun step (its ranks) exists yet (`squeue -s`: a step `ID.N`)."""
        out = self.runner.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"])
        return any(re.fullmatch(rf"{re.escape(job_id)}\.\d+", line.strip()) for line in out.splitlines())

    def signal(self, job_id: str, signal_name: str) -> None:
        """Send a signal to every rank (every step's tasks) of a job, not to its batch shell.
        A job that has ended is ignored."""
        self._scancel(["--signal", signal_name, job_id])

    def cancel(self, job_id: str) -> None:
        """End the job (Slurm sends its tasks SIGTERM, then SIGKILL after KillWait)."""
        self._scancel([job_id])

    def cancel_named(self, name: str) -> None:
        """End every job of this user named `name` (for a submission whose id is unknown)."""
        self._scancel(["--me", "--name", name])

    def _scancel(self, args: list[str]) -> None:
        try:
            self.runner.run(["scancel", *args])
        except SlurmRejected as e:
            msg = str(e).lower()
            if "already completed" in msg or "invalid job id" in msg or "job is completing" in msg:
                return
            raise
