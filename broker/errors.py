"""Error types of the broker. Each says what the caller should do next."""

from __future__ import annotations


class OnepoolError(Exception):
    """Base of every error the broker raises on purpose."""


class SpecError(OnepoolError, ValueError):
    """User input is invalid. Fix the named field(s) and try again; retrying as-is cannot work.

    `problems` holds one human line per bad field, each naming the field path and what is allowed.
    """

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid {source}:\n{lines}")


class NotFound(OnepoolError, LookupError):
    """The named job (or other object) does not exist. Check the id."""


class InvalidState(OnepoolError):
    """The request does not apply to the object's current state (e.g. cancel a finished job)."""


class NotConfigured(OnepoolError):
    """No pools or teams are known yet: apply an onepool.yaml first (`onepool apply -c FILE`)."""


class CheckpointError(OnepoolError):
    """A checkpoint could not be written or verified. The previous committed one stays valid."""


class Unpriced(OnepoolError):
    """No price is known for a rented pool (the catalog has no offer for its provider, region,
    instance type, market and zone): set its `price_per_node_hour` in onepool.yaml. A pool that
    cannot be priced is never treated as free."""
