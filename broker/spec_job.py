"""The job spec (JobSpec: what a user submits) and the field checks it shares with a team's
settings: webhook URLs and their signing secrets, the checkpoint interval, and `_short`, which
cuts a bad value to a length an error may echo. Re-exported by broker.spec."""

from __future__ import annotations

import math
import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from broker.spec_code import Shipping
from broker.spec_types import (
    MAX_GPU_TYPES,
    MAX_PATH,
    Name,
    Priority,
    SpotPolicy,
    check_argv,
    check_env,
    image_ref,
    parse_deadline,
)
from broker.spec_workflow import Workflow

SECRET_FIELDS = ("webhook_url", "webhook_secret")  # never echoed in an error


def webhook_url(v: str | None) -> str | None:
    """A team's or a job's webhook URL: http(s) only. Raises ValueError (without the value)."""
    if v is not None and not re.match(r"^https?://[^\s/]+\S*$", v):
        raise ValueError("must be an http:// or https:// URL")
    return v


def webhook_signed(url: str | None, secret: str | None) -> None:
    """Raises ValueError when a webhook URL comes without the secret that signs its deliveries."""
    if url and not secret:
        raise ValueError("webhook_secret: required with webhook_url (at least 16 characters; "
                         "deliveries are signed with it)")



DEFAULT_CHECKPOINT_INTERVAL_S = 1800.0


def checkpoint_interval(v: Any) -> float | str:
    """A job's checkpoint_interval_s: "auto", or seconds (a number > 0; a numeric string is
    read as one). Raises ValueError naming the allowed values."""
    if isinstance(v, str):
        if v.strip().lower() == "auto":
            return "auto"
        try:
            v = float(v)
        except ValueError:
            raise ValueError(f"must be a number of seconds > 0 or 'auto' (got {_short(v)})") from None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"must be a number of seconds > 0 or 'auto' (got {_short(v)})")
    return float(v)


class JobSpec(Workflow, Shipping):
    """What a user submits. `command` is an argv list (a string is split with shlex). Arrays,
    sweeps, dependencies and retries: see broker.spec_workflow.Workflow (issue 29); its code,
    setup and data: broker.spec_code.Shipping (issue 26).

    Sizes are bounded (broker.spec_types: MAX_ARG_BYTES, MAX_ARGV_BYTES, MAX_ENV_*, MAX_PATH,
    MAX_GPU_TYPES), below what Linux can start, so a spec the broker stores can be run; a spec
    over a limit is refused at submit, naming the field and the limit."""

    name: Name
    team: Name
    command: list[str] = Field(min_length=1)
    experiment: Name = "default"
    env: dict[str, str] = Field(default_factory=dict)
    # where the command runs; default: where it was submitted from
    workdir: str | None = Field(default=None, max_length=MAX_PATH)
    # an OCI image each rank runs in (issue 26; providers.container); None: on the node itself
    image: str | None = None
    gpus_per_node: int = Field(default=1, ge=1, le=64)
    nodes: int = Field(default=1, ge=1, le=1024)
    gpu_types: list[Annotated[str, Field(max_length=40)]] = Field(
        default_factory=list, max_length=MAX_GPU_TYPES)  # empty: any type
    priority: Priority = Priority.NORMAL
    budget_usd: float | None = Field(default=None, ge=0.0)
    spot: SpotPolicy = SpotPolicy.ALLOWED
    # seconds, or "auto": the broker advises it from measured save times and stop rates
    # (broker.policy.intervals) and hands it to each attempt at its start
    checkpoint_interval_s: float | Literal["auto"] = DEFAULT_CHECKPOINT_INTERVAL_S
    expected_duration_s: float | None = Field(default=None, gt=0.0)
    # finish by then (broker.policy.deadlines): an ISO time with its zone, or a duration from
    # the submission (broker.spec_types.DEADLINE_HELP)
    deadline: str | None = Field(default=None, max_length=100)
    # Its own webhook (issue 30, broker.control.notify): hears of this job's end, failure,
    # preemption and interruption, besides its team's. Secrets: never shown or logged.
    webhook_url: str | None = Field(default=None, max_length=2000)
    webhook_secret: str | None = Field(default=None, min_length=16, max_length=200)

    @field_validator("webhook_url")
    @classmethod
    def _webhook(cls, v: str | None) -> str | None:
        return webhook_url(v)

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        return image_ref(v)

    @model_validator(mode="after")
    def _webhook_signed(self) -> JobSpec:
        webhook_signed(self.webhook_url, self.webhook_secret)
        return self

    @field_validator("checkpoint_interval_s", mode="before")
    @classmethod
    def _interval(cls, v: Any) -> Any:
        return checkpoint_interval(v)

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_deadline(v)
            except ValueError as e:
                raise ValueError(str(e).removeprefix("deadline: ")) from None
        return v

    def deadline_at(self, submitted: float) -> float | None:
        """The deadline in epoch seconds for a job submitted at `submitted` (None: none)."""
        if self.deadline is None:
            return None
        kind, v = parse_deadline(self.deadline)
        return submitted + v if kind == "in" else v

    @property
    def checkpoint_auto(self) -> bool:
        return self.checkpoint_interval_s == "auto"

    @property
    def interval_hint_s(self) -> float:
        """The interval in seconds; for "auto", the default until the broker advises one."""
        v = self.checkpoint_interval_s
        return DEFAULT_CHECKPOINT_INTERVAL_S if v == "auto" else v

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return shlex.split(v) if isinstance(v, str) else v

    @field_validator("command")
    @classmethod
    def _argv_size(cls, v: list[str]) -> list[str]:
        return check_argv(v)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        check_env(v)
        for k in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
                raise ValueError(f"variable name {k!r} is not a valid environment name")
            if k.startswith("ONEPOOL_") or k == "CUDA_VISIBLE_DEVICES":
                raise ValueError(f"{k} is set by the broker and cannot be overridden")
        return v

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def _short(value: Any, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters (an error does not echo a 100 KB input back)."""
    r = repr(value)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(r)} characters)"


