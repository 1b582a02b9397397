"""The building blocks of every validated input (broker.spec): names, priorities, spot
policies, markets, and the strict base model that refuses unknown fields, NUL bytes and
non-finite numbers."""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
)

NAME_RE = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
NAME_HELP = "lowercase letters, digits, '_', '.', '-' (1-63 chars, starting with a letter or digit)"


class Priority(StrEnum):
    """Priority classes, highest first. `rank` orders them: urgent=3 ... low=0."""

    URGENT = "urgent"
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Priority.URGENT: 3, Priority.HIGH: 2, Priority.NORMAL: 1, Priority.LOW: 0}
PRIORITIES_BY_RANK = sorted(Priority, key=lambda p: -_RANK[p])


class SpotPolicy(StrEnum):
    """Whether a job may run on spot capacity."""

    NEVER = "never"
    ALLOWED = "allowed"
    ONLY = "only"


class Market(StrEnum):
    """How a pool's capacity is paid for."""

    ONPREM = "onprem"
    ON_DEMAND = "on_demand"
    SPOT = "spot"


Name = Annotated[str, Field(pattern=NAME_RE)]

# Numbers a client sends that the database stores or compares: ids beyond what its integers
# hold (2^63 - 1) do not exist, and an output offset past 16 TiB (ext4's largest file, far
# beyond any capped log) cannot be read. Every id and offset of the API is one of these, so
# a larger one is a 422 naming the field, not an overflow deep in a query.
MAX_ID = 2**63 - 1
MAX_LOG_OFFSET = 2**44  # 16 TiB
MAX_PID = 2**22  # Linux's pid_max limit (PID_MAX_LIMIT)
DbId = Annotated[int, Field(ge=0, le=MAX_ID)]
LogOffset = Annotated[int, Field(ge=0, le=MAX_LOG_OFFSET)]


# -- what a job may send ------------------------------------------------------------------------
# A rank is started with execve(argv, env): Linux refuses one string over MAX_ARG_STRLEN
# (128 KiB) and argv + env over ARG_MAX (2 MiB with the default 8 MiB stack) with E2BIG, and
# the broker adds its own variables (and a local pool's or agent's environment) to the job's.
# These limits keep a job's part well below both, so a spec the broker accepts can start.
MAX_ARG_BYTES = 64 * 1024  # one argument (UTF-8)
MAX_ARGS = 4096  # arguments in `command`
MAX_ARGV_BYTES = 512 * 1024  # all of `command`: sum of each argument's bytes + 1 (its NUL)
MAX_ENV_ENTRIES = 256  # variables in `env`
MAX_ENV_NAME = 255  # characters of one variable name
MAX_ENV_VALUE_BYTES = 64 * 1024  # one NAME=value string (UTF-8)
MAX_ENV_BYTES = 256 * 1024  # all of `env`: sum of each NAME=value's bytes + 1
MAX_PATH = 4096  # `workdir` (Linux PATH_MAX)
MAX_GPU_TYPES = 64  # entries of `gpu_types`, each at most 40 characters like a pool's
KIB = 1024


def _size(n: int) -> str:
    return f"{n // KIB} KiB" if n >= KIB and n % KIB == 0 else f"{n} bytes"


def check_argv(argv: list[str]) -> list[str]:
    """`argv` if it is within the limits above; raises ValueError naming the argument and the
    limit otherwise (pydantic puts the field's name in front)."""
    if len(argv) > MAX_ARGS:
        raise ValueError(f"at most {MAX_ARGS} arguments (got {len(argv)})")
    total = 0
    for i, arg in enumerate(argv):
        n = len(arg.encode("utf-8", "surrogatepass"))
        if n > MAX_ARG_BYTES:
            raise ValueError(f"item {i} is {n} bytes; one argument may be at most {_size(MAX_ARG_BYTES)} "
                             "(pass large data in a file the job reads, not on its command line)")
        total += n + 1
    if total > MAX_ARGV_BYTES:
        raise ValueError(f"the arguments total {total} bytes; at most {_size(MAX_ARGV_BYTES)} "
                         "(pass large data in a file the job reads)")
    return argv


def check_env(env: dict[str, str]) -> dict[str, str]:
    """`env` if it is within the limits above; raises ValueError naming the variable and the
    limit otherwise."""
    if len(env) > MAX_ENV_ENTRIES:
        raise ValueError(f"at most {MAX_ENV_ENTRIES} variables (got {len(env)})")
    total = 0
    for k, v in env.items():
        if len(k) > MAX_ENV_NAME:
            raise ValueError(f"variable name {k[:40]!r}... is {len(k)} characters; at most {MAX_ENV_NAME}")
        n = len(k.encode()) + 1 + len(v.encode("utf-8", "surrogatepass"))
        if n > MAX_ENV_VALUE_BYTES:
            raise ValueError(f"{k} is {n} bytes (NAME=value); one variable may be at most "
                             f"{_size(MAX_ENV_VALUE_BYTES)} (pass large data in a file the job reads)")
        total += n + 1
    if total > MAX_ENV_BYTES:
        raise ValueError(f"the variables total {total} bytes (NAME=value each); at most "
                         f"{_size(MAX_ENV_BYTES)}")
    return env


class _Strict(BaseModel):
    """Every input model: unknown fields, NUL bytes and non-finite numbers (inf, nan, 1e400)
    are refused, naming the field."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True,
                              allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, v: Any) -> Any:
        where = _nul_in(v)
        if where is not None:
            raise ValueError(f"must not contain a NUL byte (\\x00){where}")
        return v


def _nul_in(v: Any, path: str = "") -> str | None:
    """Where in `v` (a string, or lists/dicts of them) a NUL byte is: "" for `v` itself,
    " in KEY" inside a mapping or list; None if there is none."""
    if isinstance(v, str):
        return path if "\x00" in v else None
    if isinstance(v, dict):
        for k, x in v.items():
            hit = _nul_in(str(k), f" in key {str(k)!r}") or _nul_in(x, f" in {str(k)!r}")
            if hit is not None:
                return hit
    if isinstance(v, list | tuple):
        for i, x in enumerate(v):
            hit = _nul_in(x, f" in item {i}")
            if hit is not None:
                return hit
    return None


# -- who ranks run as on a host (providers.isolation): host settings, never the API ---------
RUN_AS_HELP = ("USER, UID[:GID], or TEAM=USER,...,*=USER (a user per team; `*` for the others), "
               "where USER is a login name (letters, digits, '_', '-', '.') or UID[:GID]")
_USER_RE = re.compile(r"^([a-z_][a-z0-9_.-]{0,31}\$?|[0-9]{1,10}(:[0-9]{1,10})?)$", re.IGNORECASE)
_TEAM_RE = re.compile(NAME_RE)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_run_as(text: str) -> tuple[str | None, dict[str, str]]:
    """`run_as` (ONEPOOL_RUN_AS, `onepool agent --run-as`): (the user for every team not
    named, {team: user}). Raises ValueError naming the field and the allowed forms."""
    default: str | None = None
    teams: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        team, sep, user = item.rpartition("=")
        if not _USER_RE.match(user) or (sep and team != "*" and not _TEAM_RE.match(team)):
            raise ValueError(f"run_as: {item!r} is not one of {RUN_AS_HELP}")
        if not sep or team == "*":
            if default is not None:
                raise ValueError(f"run_as: two users for every other team ({default!r}, {user!r}); "
                                 f"allowed: {RUN_AS_HELP}")
            default = user
        elif teams.setdefault(team, user) != user:
            raise ValueError(f"run_as: team {team!r} is named twice; allowed: {RUN_AS_HELP}")
    return default, teams


def parse_pass_env(text: str) -> list[str]:
    """`pass_env` (ONEPOOL_PASS_ENV, `onepool agent --pass-env`): comma-separated names of
    this host's environment variables every rank also gets. ONEPOOL_* names are refused."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if not _ENV_NAME_RE.match(n) or n.startswith("ONEPOOL_"):
            raise ValueError(f"pass_env: {n!r} is not a variable name a rank may get (letters, "
                             f"digits and '_', not starting with a digit or ONEPOOL_)")
    return list(dict.fromkeys(names))


# -- container images (issue 26) -----------------------------------------------------------------
class ContainerRuntime(StrEnum):
    """What runs a job's image on a pool's nodes: podman or docker on local and agent nodes;
    on a Slurm pool, the cluster's container plug-in (pyxis through srun, apptainer)."""

    PODMAN = "podman"
    DOCKER = "docker"
    PYXIS = "pyxis"
    APPTAINER = "apptainer"


NODE_RUNTIMES = (ContainerRuntime.PODMAN, ContainerRuntime.DOCKER)
SLURM_RUNTIMES = (ContainerRuntime.PYXIS, ContainerRuntime.APPTAINER)
MAX_IMAGE_REF = 512
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
# The grammar of distribution/reference (what podman, docker and every registry accept):
# [HOST[:PORT]/]PATH[/PATH...][:TAG][@ALGO:HEX].
IMAGE_RE = re.compile(
    rf"(?:(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]{{1,5}})?/)?"
    rf"{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")
IMAGE_HELP = ("[REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST], the name in lowercase, "
              "e.g. ghcr.io/lab/train:3")


def image_ref(v: str | None) -> str | None:
    """A job's `image`: an OCI image reference, or None (no container). Raises ValueError
    saying what a reference looks like."""
    if v is None:
        return None
    if len(v) > MAX_IMAGE_REF or IMAGE_RE.fullmatch(v) is None:
        shown = v if len(v) <= 80 else v[:77] + "..."
        raise ValueError(f"{shown!r} is not an OCI image reference; expected {IMAGE_HELP}")
    return v


# -- a job's deadline (issue 31, broker.policy.deadlines) -------------------------------------
DEADLINE_HELP = ("an ISO 8601 time with its zone (2026-12-06T18:00:00Z, 2026-12-06 18:00+01:00) or a "
                 "duration from the submission (36h, 1d12h, 90m, 45s)")
_DURATION_RE = re.compile(r"^(?:\s*\d+(?:\.\d+)?\s*[dhms])+\s*$", re.IGNORECASE)
_PART_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])", re.IGNORECASE)
_ISO_SHAPE = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
_UNIT_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def parse_deadline(text: str) -> tuple[str, float]:
    """A deadline as written: ("at", epoch seconds) or ("in", seconds from the submission).
    Raises ValueError naming the field and the allowed forms. (datetime only parses here; nothing
    in the spec reads a clock: pyproject's policy contract allows this one import.)"""
    t = text.strip()
    if _DURATION_RE.match(t):
        s = sum(float(n) * _UNIT_S[u.lower()] for n, u in _PART_RE.findall(t))
        if s <= 0:
            raise ValueError(f"deadline: a duration must be more than 0 s (got {text!r})")
        return "in", s
    try:
        when = datetime.fromisoformat(t.upper().replace(" ", "T", 1)) if t[:4].isdigit() else None
    except ValueError:
        if _ISO_SHAPE.match(t):
            raise ValueError(f"deadline: {text!r} is not a valid date and time") from None
        when = None
    if when is None or when.tzinfo is None:
        raise ValueError(f"deadline: must be {DEADLINE_HELP} (got {text[:80]!r})")
    return "at", when.timestamp()


# -- quotas (issue 28): a team's nominal GPUs, borrowing and lending limits ------------------------
QUOTA_TOTAL = "*"  # the quota key of a quota over every GPU type


class QuotaSpec(_Strict):
    """A team's quota (broker.policy.quota): `gpus`, its nominal GPUs, in total (a number) or
    per GPU type (a mapping); `borrowing_limit`, how many GPUs beyond its nominal it may use
    (None: no limit); `lending_limit`, how many of its unused nominal GPUs other teams may use
    (None: all of them). Limits apply per GPU type when the quota is per type."""

    gpus: int | dict[str, int]
    borrowing_limit: int | None = Field(default=None, ge=0)
    lending_limit: int | None = Field(default=None, ge=0)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: int | dict[str, int]) -> int | dict[str, int]:
        items = v.items() if isinstance(v, dict) else [("", v)]
        for k, n in items:
            if n < 0:
                where = f" for GPU type {k!r}" if k else ""
                raise ValueError(f"must be a whole number of GPUs, 0 or more{where} (got {n})")
        if isinstance(v, dict) and not v:
            raise ValueError("must be a number of GPUs, or a mapping of GPU type to GPUs (got {})")
        return v

    def nominal(self) -> dict[str, int]:
        """Nominal GPUs by quota key: GPU type, or QUOTA_TOTAL for a total."""
        return dict(self.gpus) if isinstance(self.gpus, dict) else {QUOTA_TOTAL: self.gpus}


def check_quotas(quotas: dict[str, QuotaSpec], gpu_types: list[str]) -> list[str]:
    """Problems of the teams' quotas taken together (team name -> quota): every quota per GPU
    type or every one in total (the lab is one cohort: one kind of quota key), and only GPU
    types some pool has."""
    problems: list[str] = []
    kinds = {name: isinstance(q.gpus, dict) for name, q in quotas.items()}
    if len(set(kinds.values())) > 1:
        per = sorted(n for n, k in kinds.items() if k)
        total = sorted(n for n, k in kinds.items() if not k)
        problems.append(f"teams.quota.gpus: every team's quota must be in total (a number) or every "
                        f"one per GPU type (a mapping); per type: {', '.join(per)}; "
                        f"in total: {', '.join(total)}")
    for name, q in quotas.items():
        if isinstance(q.gpus, dict):
            bad = sorted(set(q.gpus) - set(gpu_types))
            if bad:
                problems.append(f"teams.{name}.quota.gpus: GPU type(s) {', '.join(map(repr, bad))} "
                                f"not in any pool; allowed: {', '.join(gpu_types)}")
    return problems
