"""LocalNodes: the Provider contract over this machine, for a rented-style local pool and as
the reference implementation the contract suite runs first. "Instances" are records in a
JSON file (so they survive a broker restart); nothing is billed and capacity is `limit`.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from providers.base import (
    TAG_BROKER,
    Instance,
    InstanceState,
    Interruption,
    LaunchRequest,
    NoCapacity,
    Offer,
)


class LocalNodes:
    name = "local"

    def __init__(self, path: str | os.PathLike[str], gpu_type: str = "GPU", gpus: int = 1,
                 limit: int = 64) -> None:
        self.path = Path(path)
        self.gpu_type, self.gpus, self.limit = gpu_type, gpus, limit
        self._notices: list[Interruption] = []

    def _load(self) -> dict[str, dict]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def _save(self, data: dict[str, dict]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)

    def offers(self) -> list[Offer]:
        return [Offer("local", "local", "", "local", self.gpu_type, self.gpus, "on_demand", 0.0)]

    def launch(self, req: LaunchRequest) -> Instance:
        data = self._load()
        for iid, rec in data.items():
            if rec["token"] == req.token:
                return _inst(iid, rec)
        if sum(1 for r in data.values() if r["state"] != "gone") >= self.limit:
            raise NoCapacity(f"this machine's {self.limit} local node slots are taken: use another pool")
        iid = f"local-{uuid.uuid4().hex[:10]}"
        data[iid] = {"token": req.token, "state": "running", "tags": req.tags()}
        self._save(data)
        return _inst(iid, data[iid])

    def terminate(self, instance_id: str) -> None:
        data = self._load()
        if instance_id in data:
            data[instance_id]["state"] = "gone"
            self._save(data)

    def poll(self, broker_id: str) -> list[Instance]:
        return [_inst(i, r) for i, r in self._load().items()
                if r["state"] != "gone" and r["tags"].get(TAG_BROKER) == broker_id]

    def describe(self, instance_id: str) -> Instance | None:
        rec = self._load().get(instance_id)
        return None if rec is None or rec["state"] == "gone" else _inst(instance_id, rec)

    def interrupt(self, instance_id: str) -> None:
        """Queue a notice, as a cloud would (tests and drills)."""
        n = len(self._notices)
        self._notices.append(Interruption(instance_id, "spot_interruption", key=f"local-{instance_id}-{n}",
                                          receipt=str(n)))

    def interruptions(self) -> list[Interruption]:
        """Notices stay queued until acknowledged."""
        return list(self._notices)

    def ack(self, notices: list[Interruption]) -> None:
        done = {n.key for n in notices}
        self._notices = [n for n in self._notices if n.key not in done]


def _inst(iid: str, rec: dict) -> Instance:
    return Instance(iid, InstanceState(rec["state"]), rec["tags"], "local", "on_demand")
