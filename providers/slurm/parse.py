"""Pure parsers of Slurm's command output, and the mapping of a Slurm job's end to onepool's.

Every function here takes text and returns values; none runs a command. The formats are the
ones providers.slurm.cluster asks for (see the *_FORMAT constants); the unit tests feed
them output captured from a real Slurm 22.05 (tests/slurm/fixtures/).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from enum import StrEnum

SEP = "|"
# sinfo -N -h -p PART -O <this>: one line per node of the partition
SINFO_FORMAT = "NodeList:|,StateLong:|,Gres:|,GresUsed:|"
# squeue -h -t all -O <this>: one line per job; Comment last (it may hold anything)
SQUEUE_FORMAT = "JobID:|,Name:|,State:|,Reason:|,NodeList:|,tres-per-node:|,RestartCnt:|,Comment:|"
# sacct -n -P -X -D -o <this>
SACCT_FORMAT = "JobIDRaw,JobName,State,ExitCode,NodeList"


class SlurmParseError(ValueError):
    """Slurm printed something this parser does not understand (a changed format or a
    different version): report it with the text."""


# -- GRES -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Gres:
    """One generic resource: `gpu:a100:4` -> Gres("gpu", "a100", 4); untyped: type None."""

    name: str
    type: str | None
    count: int


_GRES_ITEM = re.compile(r"^(?P<name>[A-Za-z0-9_]+)(?::(?P<type>[^:()=]+?))?(?::(?P<count>\d+[KMG]?))?"
                        r"(?:\((?:S|IDX):[^)]*\))?$")
_COUNT_MULT = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}


def parse_gres(text: str) -> list[Gres]:
    """Parse a GRES list as sinfo/scontrol/squeue print it.

    Accepts `gpu:a100:4`, `gpu:4`, `gpu` (count 1), `gpu:a100:4(S:0-1)`,
    `gpu:a100:2(IDX:0-1)`, the tres-per-node forms `gres:gpu:a100:2` and `gres/gpu:a100=2`,
    comma-separated lists of these, and `(null)` / `N/A` / empty (no GRES). Raises
    SlurmParseError for anything else.
    """
    text = text.strip()
    if text in ("", "(null)", "N/A", "none"):
        return []
    out = []
    for raw in _split_gres(text):
        item = raw.strip()
        if item.startswith("gres:") or item.startswith("gres/"):
            item = item[5:]
        item = item.replace("=", ":")
        m = _GRES_ITEM.match(item)
        if m is None:
            raise SlurmParseError(f"cannot parse GRES {raw!r} in {text!r}")
        count = m["count"]
        typ = m["type"]
        if count is None and typ is not None and re.fullmatch(r"\d+[KMG]?", typ):  # `gpu:4`: a count
            typ, count = None, typ
        out.append(Gres(m["name"], typ, 1 if count is None else _count(count)))
    return out


def _count(text: str) -> int:
    """`4` -> 4, `1K` -> 1024 (Slurm's suffixes for large counts)."""
    suffix = text[-1] if text[-1] in "KMG" else ""
    return int(text.removesuffix(suffix)) * _COUNT_MULT[suffix]


def _split_gres(text: str) -> list[str]:
    """Split on commas outside parentheses (`gpu:a100:2(IDX:0,2)` is one item)."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def gpus_in(gres: list[Gres], gres_type: str | None) -> int:
    """GPUs in a GRES list: of `gres_type` (case-insensitive), or of any type when None."""
    want = None if gres_type is None else gres_type.lower()
    return sum(g.count for g in gres if g.name == "gpu"
               and (want is None or (g.type or "").lower() == want))


# -- host lists -------------------------------------------------------------------------------
def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm host list: `n[01-03,07],gpu5,r[1-2]-n[1-2]` -> n01 n02 n03 n07 gpu5
    r1-n1 r1-n2 r2-n1 r2-n2. Leading zeros are kept. `(null)`, `None assigned` and empty
    give []. Raises SlurmParseError for unbalanced brackets or a bad range."""
    text = text.strip()
    if text in ("", "(null)", "None assigned", "N/A"):
        return []
    out: list[str] = []
    for item in _split_top(text):
        pieces = re.split(r"(\[[^\]]*\])", item)
        choices: list[list[str]] = []
        for p in pieces:
            if p.startswith("["):
                choices.append(_ranges(p[1:-1], text))
            elif "[" in p or "]" in p:
                raise SlurmParseError(f"unbalanced brackets in host list {text!r}")
            elif p:
                choices.append([p])
        out.extend("".join(c) for c in itertools.product(*choices))
    return out


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise SlurmParseError(f"unbalanced brackets in host list {text!r}")
    parts.append("".join(cur))
    return [p for p in parts if p]


def _ranges(spec: str, text: str) -> list[str]:
    out = []
    for r in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", r.strip())
        if m is None:
            raise SlurmParseError(f"bad range {r!r} in host list {text!r}")
        lo, hi = m[1], m[2] or m[1]
        if int(hi) < int(lo):
            raise SlurmParseError(f"bad range {r!r} in host list {text!r}")
        out.extend(str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1))
    return out


# -- nodes (sinfo) ----------------------------------------------------------------------------
USABLE_NODE_STATES = frozenset({"idle", "mixed", "allocated", "completing", "planned"})
# sinfo flags a state with a suffix: * not responding, ~ powered off, # powering up,
# ! pending power down, % powering down, $ maintenance, @ pending reboot, ^ rebooting, - planned
_BAD_SUFFIXES = set("*~#!%$@^")


@dataclass(frozen=True)
class SlurmNode:
    """A node of the partition as sinfo shows it."""

    name: str
    state: str  # sinfo's long state, e.g. "idle", "mixed", "drained", "down*"
    gres: tuple[Gres, ...]
    gres_used: tuple[Gres, ...]

    @property
    def usable(self) -> bool:
        """New work may land here: not drained, draining, down, failing, in maintenance, not
        responding or powered off."""
        base = self.state.rstrip("".join(_BAD_SUFFIXES) + "-")
        return base in USABLE_NODE_STATES and not (set(self.state) & _BAD_SUFFIXES)

    def gpus(self, gres_type: str | None) -> int:
        return gpus_in(list(self.gres), gres_type)

    def gpus_used(self, gres_type: str | None) -> int:
        return gpus_in(list(self.gres_used), gres_type)


def parse_sinfo(text: str) -> list[SlurmNode]:
    """Nodes from `sinfo -N -h -p PART -O SINFO_FORMAT` (a node in two partitions listed by
    `-p` once per partition is returned once)."""
    nodes: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split(SEP)
        if len(f) < 4:
            raise SlurmParseError(f"sinfo line has {len(f)} fields, expected 4: {line!r}")
        for name in expand_hostlist(f[0]):
            nodes.setdefault(name, SlurmNode(name, f[1].strip().lower(), tuple(parse_gres(f[2])),
                                             tuple(parse_gres(f[3]))))
    return list(nodes.values())


# -- jobs (squeue, scontrol show job, sacct, jobcomp) -----------------------------------------
@dataclass(frozen=True)
class SlurmJob:
    """A job as squeue lists it."""

    job_id: str
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, PREEMPTED, ...
    reason: str
    nodes: tuple[str, ...]
    gres_per_node: tuple[Gres, ...]
    restarts: int
    comment: str


def parse_squeue(text: str) -> list[SlurmJob]:
    """Jobs from `squeue -h -t all -O SQUEUE_FORMAT`."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split(SEP, 7)
        if len(f) < 8:
            raise SlurmParseError(f"squeue line has {len(f)} fields, expected 8: {line!r}")
        comment = f[7][:-1] if f[7].endswith(SEP) else f[7]
        try:
            restarts = int(f[6].strip() or 0)
        except ValueError:
            raise SlurmParseError(f"squeue restart count {f[6]!r} is not a number: {line!r}") from None
        out.append(SlurmJob(f[0].strip(), f[1].strip(), f[2].strip().upper(), f[3].strip(),
                            tuple(expand_hostlist(f[4])), tuple(parse_gres(f[5])), restarts,
                            "" if comment.strip() == "(null)" else comment.strip()))
    return out


@dataclass(frozen=True)
class JobRecord:
    """What Slurm says about a job that may have ended: its state, its exit code and the
    signal that ended it (from "ExitCode=CODE:SIGNAL"), and how often Slurm requeued it."""

    job_id: str
    state: str
    exit_code: int | None = None
    signal: int | None = None
    restarts: int = 0
    name: str = ""


_KV = re.compile(r"(?:^|\s)(JobId|JobName|Name|JobState|ExitCode|Restarts)=(\S*)")


def parse_job_line(line: str) -> JobRecord:
    """One job from a `scontrol -o show job ID` line or a jobcomp/filetxt log line (both are
    KEY=VALUE pairs). Raises SlurmParseError without a JobId and a JobState."""
    kv: dict[str, str] = {}
    for k, v in _KV.findall(line):
        kv.setdefault(k, v)
    if "JobId" not in kv or "JobState" not in kv:
        raise SlurmParseError(f"no JobId/JobState in {line[:200]!r}")
    code, sig = parse_exit_code(kv.get("ExitCode", ""))
    return JobRecord(kv["JobId"], kv["JobState"].upper(), code, sig,
                     int(kv.get("Restarts", "0") or 0), kv.get("JobName", kv.get("Name", "")))


def parse_jobcomp(text: str, job_id: str) -> JobRecord | None:
    """The newest record of `job_id` in a jobcomp/filetxt log (a requeued job has several)."""
    found = None
    needle = f"JobId={job_id} "
    for line in text.splitlines():
        if line.startswith(needle):
            found = parse_job_line(line)
    return found


def parse_sacct(text: str) -> list[JobRecord]:
    """Records from `sacct -n -P -X -D -o SACCT_FORMAT` (with -D a requeued job shows each run;
    `restarts` counts the earlier runs of the same id)."""
    out: list[JobRecord] = []
    seen: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split(SEP)
        if len(f) < 4:
            raise SlurmParseError(f"sacct line has {len(f)} fields, expected 5: {line!r}")
        state = f[2].split()[0].upper()  # "CANCELLED by 0" -> CANCELLED
        code, sig = parse_exit_code(f[3])
        jid = f[0].strip()
        out.append(JobRecord(jid, state, code, sig, seen.get(jid, 0), f[1]))
        seen[jid] = seen.get(jid, 0) + 1
    return out


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """Slurm's "CODE:SIGNAL" -> (code, signal); "" -> (None, None)."""
    text = text.strip()
    if not text:
        return None, None
    m = re.fullmatch(r"(\d+):(\d+)", text)
    if m is None:
        raise SlurmParseError(f"exit code {text!r} is not CODE:SIGNAL")
    return int(m[1]), int(m[2])


# -- what a job's state means to onepool --------------------------------------------------------
class Outcome(StrEnum):
    """A Slurm job's state, as onepool acts on it."""

    QUEUED = "queued"  # submitted, not started (yet)
    RUNNING = "running"  # holding its nodes (running, completing, suspended, ...)
    DONE = "done"  # exit 0
    FAILED = "failed"  # the job's own failure (non-zero exit, out of memory, ...)
    CANCELLED = "cancelled"  # scancel (by onepool, or by someone else)
    PREEMPTED = "preempted"  # Slurm preempted it for other work
    REQUEUED = "requeued"  # Slurm requeued it (onepool requeues the attempt itself instead)
    TIME_LIMIT = "time_limit"  # the partition's time limit ended it
    NODE_FAILURE = "node_failure"  # a node of its allocation failed


_LIVE = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "SIGNALING", "STAGE_OUT",
         "RESIZING", "STOPPED"}
_QUEUED = {"PENDING", "RESV_DEL_HOLD"}
_REQUEUED = {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT"}
_FAILED = {"FAILED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
_CANCELLED = {"CANCELLED", "REVOKED"}


def outcome(state: str, restarts: int = 0, exit_code: int | None = None) -> Outcome:
    """What a job in `state` means for its onepool attempt.

    A job Slurm has requeued (restart count > 0) is REQUEUED whatever it does next: onepool
    never lets an attempt run twice, it requeues the job in its own queue instead. COMPLETED
    with a non-zero exit code (not seen in practice) counts as FAILED. Raises
    SlurmParseError for a state it does not know.
    """
    s = state.upper().split()[0] if state.strip() else ""
    s = s.rstrip("+")
    if restarts > 0 or s in _REQUEUED:
        return Outcome.REQUEUED
    if s in _QUEUED:
        return Outcome.QUEUED
    if s in _LIVE:
        return Outcome.RUNNING
    if s == "COMPLETED":
        return Outcome.DONE if not exit_code else Outcome.FAILED
    if s in _FAILED:
        return Outcome.FAILED
    if s in _CANCELLED:
        return Outcome.CANCELLED
    if s == "PREEMPTED":
        return Outcome.PREEMPTED
    if s == "TIMEOUT":
        return Outcome.TIME_LIMIT
    if s == "NODE_FAIL":
        return Outcome.NODE_FAILURE
    raise SlurmParseError(f"unknown Slurm job state {state!r}")


def exit_status(code: int | None, signal: int | None) -> int | None:
    """The exit status a shell would report: the code, or 128 + the signal that killed it;
    None when Slurm recorded neither (0:0 of a job that did not complete)."""
    if signal:
        return 128 + signal
    return code
