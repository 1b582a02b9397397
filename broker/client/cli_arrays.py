"""The CLI's view of arrays (issue 29): an array is named by its first element's id, and its
elements are ordinary jobs, so what `onepool status --array` and `onepool cancel --array` do
is list them with the client (embedded or HTTP alike) and act on each."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.errors import NotFound

if TYPE_CHECKING:
    from broker.state.views import JobInfo

FINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "BUDGET_EXHAUSTED")


def elements(client: Any, array_id: int, team: str | None = None) -> list[JobInfo]:
    """The jobs of array `array_id`, by index. Raises NotFound when it has none."""
    found = [j for j in client.list(team=team) if j.array_id == array_id]
    if not found:
        raise NotFound(f"no array with id {array_id} (an array is named by its first element's id; "
                       "see `onepool status`)")
    return sorted(found, key=lambda j: j.array_index or 0)


def cancel_array(client: Any, array_id: int) -> list[JobInfo]:
    """Cancel every element of the array not ended yet; returns each element as it is after.
    Raises NotFound (no such array), Forbidden (another team's)."""
    return [client.cancel(j.id) if j.status not in FINAL else j for j in elements(client, array_id)]
