"""The batch script of one onepool attempt: ONE Slurm allocation, one rank per node.

    #SBATCH --job-name=onepool-<broker id>-a<attempt id>   (how a restarted broker finds it)
    #SBATCH --comment=onepool broker=... job=... attempt=... pool=...
    #SBATCH --nodes=K --ntasks-per-node=1 --nodelist=<the nodes onepool placed it on>
    #SBATCH --gres=gpu:<type>:<GPUs per node> --no-requeue --signal=USR1@<grace>
    exec srun ... <the job's command>     rank = $SLURM_PROCID, one task per node

What it promises:
- The onepool environment of the attempt is exported (ONEPOOL_*; never CUDA_VISIBLE_DEVICES,
  which Slurm sets per node from the GPUs it allocated, and ONEPOOL_RANK, set per task).
- `--no-requeue`: Slurm cancels the job when it preempts it instead of running it again;
  onepool requeues the job in its own queue and resumes it from its checkpoint. If Slurm
  requeues it anyway (an admin), the rerun exits at once (exit 75) without running anything.
- Signals: `scancel --signal=X` reaches every rank (srun's tasks); Slurm's own signals to
  the batch shell reach srun (the script execs it), which forwards them to the ranks.
  `--signal=USR1@grace` asks for a checkpoint that long before a time limit.
- A rank that fails (exit not 0 and not 143) asks the other ranks to stop (SIGTERM), as
  onepool does for a gang whose rank failed; the job then ends FAILED.
- A rank that cannot start (its working directory missing, not a directory or not
  enterable on the node; its command not found, not executable, or naming a missing
  interpreter) says why and exits with its START_EXIT code, read back as its cause.
- Output: each rank's to `<output_dir>/attempt-<id>/rank-<r>/output.log` (where
  `onepool logs` reads it when the broker shares that filesystem), the script's own to
  `<output_dir>/attempt-<id>/slurm-<job id>.out`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

REQUEUED_EXIT = 75  # a rerun that Slurm started after requeueing: it does nothing
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NOT_EXPORTED = ("CUDA_VISIBLE_DEVICES", "ONEPOOL_RANK")

# A rank that cannot start exits with one of these codes (and says why on its output), which
# the broker reads back as the cause start_failed:<kind> (providers.start_errors). Slurm
# itself would run the job in /tmp when its --chdir is missing on the node.
START_EXIT = {"workdir_missing": 241, "workdir_not_a_directory": 242, "workdir_denied": 243,
              "command_not_found": 244, "permission_denied": 245, "bad_interpreter": 246}
_E = START_EXIT
_NOSTART = (
    'nostart() { echo "onepool: cannot start the rank on $(hostname) (start_failed:$1): $2" >&2; '
    'exit "$3"; }; w="${ONEPOOL_WORKDIR:-}"; if [ -n "$w" ]; then '
    f'[ -e "$w" ] || nostart workdir_missing "no working directory $w" {_E["workdir_missing"]}; '
    f'[ -d "$w" ] || nostart workdir_not_a_directory "not a directory: $w" '
    f'{_E["workdir_not_a_directory"]}; '
    f'cd "$w" 2>/dev/null || nostart workdir_denied "cannot enter $w" {_E["workdir_denied"]}; fi; '
    'case "$1" in */*) c="$1"; [ -e "$c" ];; *) c=$(command -v -- "$1");; esac || '
    f'nostart command_not_found "$1: not found" {_E["command_not_found"]}; '
    'if [ -f "$c" ]; then '
    f'[ -x "$c" ] || nostart permission_denied "$c: not executable" {_E["permission_denied"]}; '
    """i=$(LC_ALL=C head -c 256 -- "$c" 2>/dev/null | tr -d '\\000' | head -n 1); """
    """case "$i" in '#!'*) i=${i#??}; i=${i#"${i%%[! ]*}"}; i=${i%% *}; """
    f'[ -x "$i" ] || nostart bad_interpreter "$c: interpreter $i not found" {_E["bad_interpreter"]};; '
    'esac; fi; ')

# One rank: its rank number from Slurm, the job's command; a failed rank stops the others.
# The wrapper traps TERM/USR1 (Slurm signals every process of the step) so it outlives them and
# waits for the command, whose handlers are its own (a trap is reset in the child at exec).
_RANK_SH = ('trap : TERM USR1 USR2 INT; export ONEPOOL_RANK="$SLURM_PROCID"; ' + _NOSTART + '"$@"; code=$?; '
            'if [ "$code" -ne 0 ] && [ "$code" -ne 143 ] && [ "${SLURM_NTASKS:-1}" -gt 1 ]; then '
            'echo "onepool: rank $SLURM_PROCID failed (exit $code): stopping the other ranks" >&2; '
            'scancel --signal=TERM "$SLURM_JOB_ID" >/dev/null 2>&1; fi; exit "$code"')


@dataclass(frozen=True)
class Submission:
    """Everything sbatch needs for one attempt."""

    name: str
    comment: str
    partition: str
    nodes: tuple[str, ...]  # Slurm node names, one rank each
    gpus_per_node: int
    gres_type: str | None  # None: untyped `--gres=gpu:N`
    argv: tuple[str, ...]
    env: dict[str, str]
    output_dir: str  # where attempt-<id>/ folders go (on the cluster's filesystem)
    attempt_id: int
    signal_before_s: int = 60
    account: str | None = None
    qos: str | None = None
    workdir: str | None = None
    cpus_per_gpu: int | None = None
    mem_per_gpu: str | None = None
    time_limit: str | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)
    srun_extra: tuple[str, ...] = field(default_factory=tuple)  # e.g. pyxis's --container-image

    @property
    def gres(self) -> str:
        typ = f"{self.gres_type}:" if self.gres_type else ""
        return f"gpu:{typ}{self.gpus_per_node}"

    @property
    def attempt_dir(self) -> str:
        return f"{self.output_dir.rstrip('/')}/attempt-{self.attempt_id}"


def batch_script(sub: Submission) -> str:
    """The script sbatch reads on stdin. Raises ValueError for an environment variable name
    a shell cannot export or an empty node list."""
    if not sub.nodes:
        raise ValueError("a Slurm attempt needs at least one node")
    k = len(sub.nodes)
    opts = [f"--job-name={sub.name}", f"--comment={sub.comment}", f"--partition={sub.partition}",
            f"--nodes={k}", "--ntasks-per-node=1", f"--nodelist={','.join(sub.nodes)}",
            f"--gres={sub.gres}", "--no-requeue", f"--signal=USR1@{max(1, sub.signal_before_s)}",
            f"--output={sub.attempt_dir}/slurm-%j.out", "--open-mode=append"]
    optional = {"account": sub.account, "qos": sub.qos, "chdir": sub.workdir,
                "cpus-per-gpu": sub.cpus_per_gpu, "mem-per-gpu": sub.mem_per_gpu, "time": sub.time_limit}
    opts += [f"--{flag}={value}" for flag, value in optional.items() if value]
    opts.extend(sub.extra)
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {o}" for o in opts]
    lines += [
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
        '    echo "onepool: Slurm requeued this attempt; onepool requeues the job itself" >&2',
        f"    exit {REQUEUED_EXIT}",
        "fi",
    ]
    for key, value in sorted(sub.env.items()):
        if not _ENV_NAME.match(key):
            raise ValueError(f"env: {key!r} is not a name a shell can export")
        if key not in NOT_EXPORTED:
            lines.append(f"export {key}={shlex.quote(value)}")
    ranks = " ".join(shlex.quote(f"{sub.attempt_dir}/rank-{r}") for r in range(k))
    lines.append(f"mkdir -p {ranks}")
    srun = ["srun", f"--nodes={k}", f"--ntasks={k}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
            f"--output={sub.attempt_dir}/rank-%t/output.log", "--open-mode=append", *sub.srun_extra,
            "bash", "-c", _RANK_SH, "onepool-rank", *sub.argv]
    lines.append("exec " + " ".join(shlex.quote(a) for a in srun))
    return "\n".join(lines) + "\n"


def in_container(runtime: str, image: str, argv: tuple[str, ...],
                 workdir: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The srun options and the rank's command line that run `argv` in `image` through the
    pool's container plug-in (issue 26): pyxis (srun --container-image: the whole rank, so the
    image needs bash; the working directory mounted and entered) or apptainer (`apptainer exec
    --nv docker://IMAGE ...` as the rank's command). Not exercised against a real cluster here:
    the Slurm test cluster has neither plug-in. Raises ValueError for another runtime."""
    if runtime == "pyxis":
        opts = [f"--container-image={image}"]
        if workdir:
            opts += [f"--container-mounts={workdir}:{workdir}", f"--container-workdir={workdir}"]
        return tuple(opts), argv
    if runtime == "apptainer":
        return (), ("apptainer", "exec", "--nv", f"docker://{image}", *argv)
    raise ValueError(f"container_runtime: a slurm pool takes pyxis or apptainer (got {runtime!r})")
