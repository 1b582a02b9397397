"""The API's JSON read as it is, without pydantic (issue 27: a CLI that starts fast): the HTTP
fast path of `onepool submit` and `onepool status` (broker.client.cli_fast) prints the server's
answers through these views instead of validating them into broker.wire's models, which would
cost more than the rest of the command. The server still validates what it sends (its
responses are broker.wire models); a view checks that the fields the CLI reads are there,
so an older server fails with a message saying so, not with a KeyError deep in a table.
"""

from __future__ import annotations

from typing import Any

from broker.errors import OnepoolError

# The fields of each broker.wire model the CLI reads (tests/test_cli_fast.py checks each is
# a field of that model).
ATTEMPT_FIELDS = ("number", "pool", "alloc", "state", "started_at", "ended_at", "end_reason", "cause",
                  "restored_step", "reached_step", "lost_gpu_s", "restart_overhead_s", "restore_bytes",
                  "egress_bytes", "egress_usd", "gpu_util_pct", "gpu_util_mean_pct", "gpu_idle_since",
                  "held_idle", "phases")
JOB_FIELDS = ("id", "name", "team", "priority", "status", "nodes", "gpus_per_node", "attempts",
              "preemptions", "wait_s", "gpu_s", "lost_gpu_s", "resumed_from_step", "progress_step",
              "progress_total", "eta", "egress_bytes", "egress_usd", "waiting_reason", "held_idle",
              "array_id", "array_index", "attempt_list", "checkpoint_stores", "caused_lost_gpu_s",
              "checkpoint_interval_s", "checkpoint_auto", "checkpoint_advice", "deadline", "deadline_where")
HEALTH_FIELDS = ("broker_up", "leader", "fencing", "last_cycle_at", "down_since", "summary")
EVENT_FIELDS = ("kind", "message", "job_id", "time", "actor")
ADVICE_FIELDS = ("interval_s", "save_s", "rate_per_h", "basis", "current_saving_s_per_h",
                 "current_lost_s_per_h", "advised_saving_s_per_h", "advised_lost_s_per_h")


class OldServer(OnepoolError):
    """The server's answer lacks fields this client reads: upgrade the server (or use a client
    of its version)."""


def ever_ran(last_cycle_at: float | None, fencing: int) -> bool:
    """Whether a broker ever led this database (broker.wire.Health.ever_ran)."""
    return last_cycle_at is not None or fencing > 0


class View:
    """One object of the server's JSON, read by attribute (`job.status`) as the broker.wire
    model of the same name would be; `model_dump()` gives the JSON back as it came. Raises
    OldServer when a field of `fields` is missing."""

    __slots__ = ("_data",)
    kind = "object"
    fields: tuple[str, ...] = ()

    def __init__(self, data: Any) -> None:
        if not isinstance(data, dict):
            raise OldServer(f"the server answered a {type(data).__name__} where a {self.kind} was expected")
        missing = [f for f in self.fields if f not in data]
        if missing:
            raise OldServer(f"the server's {self.kind} lacks {', '.join(missing)}: is the server older than "
                            "this client? upgrade it")
        self._data = data

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._data[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}") from None

    def model_dump(self) -> dict[str, Any]:
        return self._data


class AttemptView(View):
    __slots__ = ()
    kind = "attempt"
    fields = ATTEMPT_FIELDS


class JobView(View):
    """A job (broker.wire.JobInfo); `attempt_list` holds AttemptViews."""

    __slots__ = ("attempt_list", "checkpoint_advice")
    kind = "job"
    fields = JOB_FIELDS

    def __init__(self, data: Any) -> None:
        super().__init__(data)
        self.attempt_list = [AttemptView(a) for a in data["attempt_list"]]
        advice = data["checkpoint_advice"]
        self.checkpoint_advice = None if advice is None else AdviceView(advice)


class AdviceView(View):
    """A job's checkpoint interval advice (broker.wire.CheckpointAdvice)."""

    __slots__ = ()
    kind = "checkpoint advice"
    fields = ADVICE_FIELDS


class HealthView(View):
    __slots__ = ()
    kind = "health"
    fields = HEALTH_FIELDS

    @property
    def ever_ran(self) -> bool:
        return ever_ran(self.last_cycle_at, self.fencing)


class EventView(View):
    __slots__ = ()
    kind = "event"
    fields = EVENT_FIELDS
