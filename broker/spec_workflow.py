"""The parts of a job spec that make a workflow of it (issue 29): arrays and sweeps (one submit,
many jobs), dependencies on other jobs, and retries of its own failures. JobSpec
(broker.spec) inherits them; the rules behind them are pure (broker.policy.arrays,
broker.policy.dependencies, broker.policy.retries)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from broker.spec_types import _Strict


class Workflow(_Strict):
    """Arrays, sweeps, dependencies, retries. The validators read `command` and `env`, which
    the job spec defines."""

    if TYPE_CHECKING:  # fields of the job spec
        command: list[str]
        env: dict[str, str]

    # Arrays and sweeps (issue 29, broker.policy.arrays): one submit makes one job per index
    # ("0-99%10") or per point of a grid whose values fill {name} fields of command and env.
    array: str | None = None
    sweep: dict[str, list[str | int | float | bool]] | None = None
    max_running: int | None = Field(default=None, ge=1)  # elements running at once (None: any)
    # Retries of the job's own failures (issue 29, broker.policy.retries): up to `retries`
    # times, after a backoff doubling from retry_backoff_s; these exit codes are never retried.
    retries: int = Field(default=0, ge=0, le=100)
    retry_backoff_s: float = Field(default=30.0, ge=0.0, le=86400.0)
    no_retry_exit_codes: list[int] = Field(default_factory=list)

    # Dependencies (issue 29, broker.policy.dependencies): "12:ok", "7[*]:any", "7[i]:ok".
    after: list[str] = Field(default_factory=list, max_length=100)

    @field_validator("after")
    @classmethod
    def _after(cls, v: list[str]) -> list[str]:
        from broker.policy.dependencies import parse_after

        for text in v:
            parse_after(text)
        return v

    @field_validator("no_retry_exit_codes")
    @classmethod
    def _exit_codes(cls, v: list[int]) -> list[int]:
        bad = [c for c in v if not 1 <= c <= 255]
        if bad:
            raise ValueError(f"exit codes are 1 to 255 (got {bad[0]})")
        return sorted(set(v))

    @field_validator("array")
    @classmethod
    def _array(cls, v: str | None) -> str | None:
        from broker.policy.arrays import parse_array

        if v is not None:
            parse_array(v)
        return v

    @field_validator("sweep")
    @classmethod
    def _sweep(cls, v: dict[str, list[str | int | float | bool]] | None) -> Any:
        from broker.policy.arrays import sweep_grid

        if v is not None:
            sweep_grid(v)
        return v

    @model_validator(mode="after")
    def _array_shape(self) -> Workflow:
        from broker.policy.arrays import fields_used, parse_array

        if self.array is not None and self.sweep is not None:
            raise ValueError("array, sweep: give one of them (a sweep's elements are indexed 0..N-1)")
        if self.max_running is not None:
            if self.array is None and self.sweep is None:
                raise ValueError("max_running: only an array or a sweep has elements to limit")
            if self.array is not None and parse_array(self.array).max_running is not None:
                raise ValueError("max_running: the array already gives its limit after %")
        if self.array is None and self.sweep is None and any("[i]" in a for a in self.after):
            raise ValueError("after: ARRAY[i] (same index) needs this submit to be an array or a sweep")
        if self.sweep is not None:
            unused = set(self.sweep) - fields_used([*self.command, *self.env.values()])
            if unused:
                raise ValueError(f"sweep: {', '.join(sorted(unused))} filled nowhere; write "
                                 f"{{{sorted(unused)[0]}}} in the command or an env value")
        return self

    def elements(self) -> list[tuple[int, list[str], dict[str, str]]]:
        """(index, command, env) of each job this submit makes: one for a plain job (index -1),
        one per array index, one per sweep point with its {name} fields filled. Each element's
        env has ONEPOOL_ARRAY_INDEX (an array or sweep only)."""
        from broker.policy.arrays import fill, parse_array, sweep_grid

        if self.array is None and self.sweep is None:
            return [(-1, list(self.command), dict(self.env))]
        points: list[tuple[int, dict[str, Any]]] = (
            [(i, {}) for i in parse_array(self.array).indices] if self.array is not None
            else list(enumerate(sweep_grid(self.sweep or {}))))
        return [(i, [fill(a, p) for a in self.command],
                 {**{k: fill(v, p) for k, v in self.env.items()}, "ONEPOOL_ARRAY_INDEX": str(i)})
                for i, p in points]

    @property
    def array_limit(self) -> int | None:
        """At most this many elements run at once (None: no limit, or not an array)."""
        from broker.policy.arrays import parse_array

        if self.array is not None and (lim := parse_array(self.array).max_running) is not None:
            return lim
        return self.max_running
