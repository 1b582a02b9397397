"""An existing Slurm cluster as a onepool pool (`provider: slurm`).

- runner: Slurm's commands on this machine or over SSH, with timeouts and errors that say
  what to do (SlurmUnreachable: retry later; SlurmRejected: fix the settings).
- parse: pure parsers of sinfo/squeue/scontrol/sacct/jobcomp output, GRES strings, host
  lists, and what a job's state means to onepool.
- script: the batch script of one attempt (one allocation, one rank per node via srun).
- cluster: the commands onepool runs (capacity, jobs, submit, signal, cancel, records).

The broker's side (node discovery into the database, the Executor) is broker.control.slurm_pools
and broker.control.slurm_exec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from providers.slurm.cluster import SlurmCluster
from providers.slurm.parse import JobRecord, SlurmJob, SlurmNode, SlurmParseError
from providers.slurm.runner import LocalRunner, Runner, SlurmRejected, SlurmUnreachable, SshRunner

if TYPE_CHECKING:
    from broker.spec import SlurmSpec

__all__ = ["JobRecord", "LocalRunner", "Runner", "SlurmCluster", "SlurmJob", "SlurmNode",
           "SlurmParseError", "SlurmRejected", "SlurmUnreachable", "SshRunner", "make_cluster"]


def make_cluster(spec: SlurmSpec) -> SlurmCluster:
    """The cluster a pool's `slurm:` settings describe (local commands, or SSH to `login`)."""
    runner: Runner
    if spec.login:
        runner = SshRunner(spec.login, spec.ssh_options, timeout_s=spec.command_timeout_s)
    else:
        runner = LocalRunner(timeout_s=spec.command_timeout_s)
    return SlurmCluster(runner, spec.partition, jobcomp_log=spec.jobcomp_log)
