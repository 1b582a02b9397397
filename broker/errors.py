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


class Unauthorized(OnepoolError):
    """No valid credential came with the request (missing, unknown, revoked or expired token).
    Get a token from an admin (`onepool token create`) and set ONEPOOL_TOKEN."""


class TooManyRequests(OnepoolError):
    """The server refuses this request for now (too many failed authentications from this
    address, or too many slow checks at once). Wait `retry_after_s` seconds, then retry; check
    the token if yours are the failures."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TooLarge(OnepoolError):
    """The request body is larger than the server accepts. Send less (a job spec is small:
    data and code travel through object storage), or raise the named setting."""


class Forbidden(OnepoolError, PermissionError):
    """The caller is known but its role or team does not allow this. Ask an admin."""


class Unavailable(OnepoolError):
    """The onepool server could not be reached or did not answer in time. Retry later; check
    ONEPOOL_URL and that `onepool server` runs."""


class NotConfigured(OnepoolError):
    """No pools or teams are known yet: apply an onepool.yaml first (`onepool apply -c FILE`)."""


class CheckpointError(OnepoolError):
    """A checkpoint could not be written or verified. The previous committed one stays valid."""


class NotLeader(OnepoolError):
    """Another broker holds the leader lease on this database. Run this one as a standby
    (`onepool broker` waits and takes over when the lease expires) or stop the other one."""


class LeaseLost(OnepoolError):
    """This broker is no longer the leader (another took the lease: a higher fencing number).
    Its write was refused and rolled back; it must stop acting and stand by."""


class ReadOnly(OnepoolError, RuntimeError):
    """Code that commits ran on a read-only view of the database (a dry run computes on a
    snapshot and keeps nothing): a bug in what the dry run calls, not in the caller's input."""


class Unpriced(OnepoolError):
    """No price is known for a rented pool (the catalog has no offer for its provider, region,
    instance type, market and zone): set its `price_per_node_hour` in onepool.yaml. A pool that
    cannot be priced is never treated as free."""


class BudgetError(OnepoolError):
    """A submission's estimated cost does not fit its (or its team's) budget. Raise the
    budget, shorten the expected duration, or allow spot."""


# What `onepool[server]` adds (pyproject.toml): a ModuleNotFoundError for one of these means
# the server parts are not installed, not a bug.
SERVER_MODULES = frozenset({"sqlmodel", "sqlalchemy", "alembic", "fastapi", "uvicorn", "httptools",
                            "apscheduler", "argon2", "numpy", "psutil", "fsspec", "starlette"})
