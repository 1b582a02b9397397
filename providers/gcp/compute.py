"""GCP Compute Engine: on-demand and SPOT VMs, labelled, idempotent, reconciled.

- The instance name is the broker's node id (unique per zone), so it is known before the
  call; insert carries request_id = a UUID derived from the token, and a second launch first
  GETs the name: a retried insert never makes a second VM.
- SPOT: Scheduling(provisioning_model=SPOT, instance_termination_action=DELETE,
  on_host_maintenance=TERMINATE, automatic_restart=False).
- Zone operations are awaited with our own ZoneOperationsClient.wait() (never
  ExtendedOperation.result(), which polls the public endpoint whatever api_endpoint says).
- poll(): aggregated_list over every zone, filtered by the broker label.
- interruptions(): `compute.instances.preempted` zone operations, and instances seen
  TERMINATED/STOPPING (a preempted SPOT VM).
"""

from __future__ import annotations

import uuid
from typing import Any

from providers.base import (
    TAG_BROKER,
    Fatal,
    Instance,
    InstanceState,
    Interruption,
    LaunchRequest,
    NoCapacity,
    Offer,
    Transient,
)
from providers.retry import retrying

CAPACITY = ("ZONE_RESOURCE_POOL_EXHAUSTED", "QUOTA_EXCEEDED", "RESOURCE_EXHAUSTED",
            "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "quotaExceeded")
STATES = {"PROVISIONING": InstanceState.PENDING, "STAGING": InstanceState.PENDING,
          "RUNNING": InstanceState.RUNNING, "STOPPING": InstanceState.STOPPING,
          "SUSPENDING": InstanceState.STOPPING, "SUSPENDED": InstanceState.STOPPING,
          "STOPPED": InstanceState.GONE, "TERMINATED": InstanceState.GONE}
DEFAULT_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124"


def map_error(e: Exception) -> Exception:
    """google.api_core errors -> NoCapacity / Transient / Fatal."""
    from google.api_core import exceptions as g

    text = str(e)
    if any(c in text for c in CAPACITY):
        return NoCapacity(f"GCP: {text} (no capacity or quota here now: another pool will be tried)")
    if isinstance(e, g.TooManyRequests | g.ServiceUnavailable | g.InternalServerError
                  | g.GatewayTimeout | g.DeadlineExceeded):
        return Transient(f"GCP: {text} (temporary: retried with backoff)")
    if isinstance(e, g.Unauthorized | g.Forbidden):
        return Fatal(f"GCP: {text} (check the service account named by the pool's credentials "
                     "and its compute.instanceAdmin role)")
    if isinstance(e, g.GoogleAPICallError):
        return Fatal(f"GCP: {text} (check the pool's instance_type, zone, image and options.project)")
    return e


def request_id(token: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"onepool:{token}"))


class GcpProvider:
    name = "gcp"

    def __init__(self, project: str, zone: str, instances: Any, operations: Any,
                 machine_types: Any = None, image: str | None = None) -> None:
        self.project, self.zone = project, zone
        self.instances, self.operations, self.machine_types = instances, operations, machine_types
        self.image = image or DEFAULT_IMAGE
        self._seen_ops: set[str] = set()

    @classmethod
    def from_config(cls, project: str, zone: str, credentials_file: str | None = None,
                    endpoint_url: str | None = None, image: str | None = None) -> GcpProvider:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import compute_v1

        kw: dict[str, Any] = {"transport": "rest"}
        if endpoint_url:  # a local fake or emulator: no credentials needed
            kw["client_options"] = ClientOptions(api_endpoint=endpoint_url)
            kw["credentials"] = AnonymousCredentials()
        elif credentials_file:
            from google.oauth2 import service_account

            kw["credentials"] = service_account.Credentials.from_service_account_file(credentials_file)
        return cls(project, zone, compute_v1.InstancesClient(**kw),
                   compute_v1.ZoneOperationsClient(**kw), compute_v1.MachineTypesClient(**kw), image)

    def _call(self, fn: Any, **kw: Any) -> Any:
        from google.api_core.exceptions import GoogleAPICallError

        try:
            return fn(**kw)
        except GoogleAPICallError as e:
            raise map_error(e) from e

    def _wait(self, op: Any) -> None:
        """Await a zone operation; its error (e.g. ZONE_RESOURCE_POOL_EXHAUSTED) is mapped."""
        from google.cloud.compute_v1 import Operation

        while op.status != Operation.Status.DONE:
            op = self._call(self.operations.wait, project=self.project, zone=self.zone,
                            operation=op.name)
        errors = [x.code for x in op.error.errors] if op.error and op.error.errors else []
        if errors:
            codes = ", ".join(errors)
            if any(c in CAPACITY for c in errors):
                raise NoCapacity(f"GCP {codes} in {self.zone} (another pool will be tried)")
            raise Fatal(f"GCP operation {op.name} failed: {codes} (check the pool's settings)")

    # -- Provider ---------------------------------------------------------------------------
    @retrying
    def offers(self) -> list[Offer]:
        out = []
        for mt in self._call(self.machine_types.list, project=self.project, zone=self.zone):
            for acc in mt.accelerators:
                out.append(Offer("gcp", self.zone.rsplit("-", 1)[0], self.zone, mt.name,
                                 acc.guest_accelerator_type, acc.guest_accelerator_count,
                                 "on_demand", None))
        return out

    @retrying
    def launch(self, req: LaunchRequest) -> Instance:
        from google.api_core.exceptions import GoogleAPICallError, NotFound
        from google.cloud import compute_v1 as c

        try:
            return _instance(self.instances.get(project=self.project, zone=self.zone,
                                                instance=req.node_id))
        except NotFound:
            pass
        except GoogleAPICallError as e:
            raise map_error(e) from e
        zone = req.zone or self.zone
        sched = c.Scheduling(provisioning_model="SPOT", instance_termination_action="DELETE",
                             on_host_maintenance="TERMINATE", automatic_restart=False) \
            if req.market == "spot" else c.Scheduling(on_host_maintenance="TERMINATE")
        inst = c.Instance(
            name=req.node_id, machine_type=f"zones/{zone}/machineTypes/{req.instance_type}",
            labels=req.tags(), scheduling=sched,
            metadata=c.Metadata(items=[c.Items(key="startup-script", value=req.user_data)]),
            disks=[c.AttachedDisk(boot=True, auto_delete=True,
                                  initialize_params=c.AttachedDiskInitializeParams(
                                      source_image=req.image or self.image, disk_size_gb=200))],
            network_interfaces=[c.NetworkInterface(network="global/networks/default")])
        op = self._call(self.instances.insert_unary, request=c.InsertInstanceRequest(
            project=self.project, zone=zone, instance_resource=inst, request_id=request_id(req.token)))
        self._wait(op)
        return _instance(self._call(self.instances.get, project=self.project, zone=zone,
                                    instance=req.node_id))

    @retrying
    def terminate(self, instance_id: str) -> None:
        from google.api_core.exceptions import NotFound

        try:
            op = self._call(self.instances.delete_unary, project=self.project, zone=self.zone,
                            instance=instance_id)
        except Fatal as e:
            if isinstance(e.__cause__, NotFound):
                return
            raise
        self._wait(op)

    @retrying
    def poll(self, broker_id: str) -> list[Instance]:
        out = []
        from google.cloud.compute_v1 import AggregatedListInstancesRequest

        pages = self._call(self.instances.aggregated_list, request=AggregatedListInstancesRequest(
            project=self.project, filter=f"labels.{TAG_BROKER}={broker_id}"))
        for _zone, scoped in pages:
            for i in scoped.instances:
                if i.labels.get(TAG_BROKER) == broker_id:
                    inst = _instance(i)
                    if inst.state != InstanceState.GONE:
                        out.append(inst)
        return sorted(out, key=lambda x: x.instance_id)

    @retrying
    def interruptions(self) -> list[Interruption]:
        out = []
        from google.cloud.compute_v1 import ListZoneOperationsRequest

        ops = self._call(self.operations.list, request=ListZoneOperationsRequest(
            project=self.project, zone=self.zone, filter='operationType="compute.instances.preempted"'))
        for op in ops:
            if op.name not in self._seen_ops:
                self._seen_ops.add(op.name)
                out.append(Interruption(op.target_link.rsplit("/", 1)[-1], "preempted", key=op.name))
        return out

    def ack(self, notices: list[Interruption]) -> None:
        return None  # preemption operations are a log, not a queue: nothing to delete

    @retrying
    def describe(self, instance_id: str) -> Instance | None:
        from google.api_core.exceptions import NotFound

        try:
            inst = _instance(self._call(self.instances.get, project=self.project, zone=self.zone,
                                        instance=instance_id))
        except Fatal as e:
            if isinstance(e.__cause__, NotFound):
                return None
            raise
        return None if inst.state == InstanceState.GONE else inst


def _instance(i: Any) -> Instance:
    return Instance(i.name, STATES.get(i.status, InstanceState.PENDING), dict(i.labels),
                    i.zone.rsplit("/", 1)[-1] if i.zone else None,
                    "spot" if i.scheduling and i.scheduling.provisioning_model == "SPOT" else "on_demand")
