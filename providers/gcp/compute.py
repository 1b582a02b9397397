"""GCP Compute Engine: on-demand and SPOT VMs, labelled, idempotent, reconciled.

- Zones: the pool's options.zones (or its zone), tried in order; a zone out of capacity
  (ZONE_RESOURCE_POOL_EXHAUSTED, ...) or without the machine or accelerator type passes the
  launch to the next. Instance ids are zone-qualified (`us-central1-a/NAME`).
- The instance name is made from the broker's node id (providers.names), so it is known
  before the call; a launch first looks the name up in every zone, and each insert carries
  request_id = a UUID derived from the token and the zone: a retried launch never makes a
  second VM.
- GPUs: a machine type with its own (a2, a3, g2...) gets none attached; any other (N1) gets
  `guest_accelerators` of the pool's accelerator type, named in the zone being tried, after
  checking that the zone offers it (providers.gcp.accelerators).
- Zone operations are awaited with our own ZoneOperationsClient.wait() (never
  ExtendedOperation.result(), which polls the public endpoint whatever api_endpoint says),
  looping while the operation is still RUNNING.
- interruptions(): `compute.instances.preempted` operations in every zone of the pool,
  newest first down to the first one already recorded in the NoticeLog (the broker's
  database), so each is reported once, also after a restart.
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
    MemoryNoticeLog,
    NoCapacity,
    NoticeLog,
    Offer,
    Transient,
)
from providers.gcp.accelerators import accelerator_type
from providers.gcp.resources import (
    DEFAULT_IMAGE,
    instance_id,
    instance_resource,
    read_instance,
    split_id,
)
from providers.names import instance_name, label_value
from providers.retry import retrying

CAPACITY = ("ZONE_RESOURCE_POOL_EXHAUSTED", "QUOTA_EXCEEDED", "RESOURCE_EXHAUSTED",
            "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "quotaExceeded")
PREEMPTED = 'operationType="compute.instances.preempted"'
MAX_WAITS = 30  # ZoneOperations.wait returns after at most 2 minutes: about an hour in all


class NotInZone(Fatal):
    """The zone does not offer the machine or accelerator type: another zone may."""


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
    """One pool's zones. `clients` are compute_v1 clients: instances, operations (zone
    operations), machine_types, accelerator_types. `opts` is the pool's GcpOptions."""

    name = "gcp"

    def __init__(self, project: str, zones: list[str], clients: dict[str, Any], opts: Any,
                 image: str | None = None, gpu_type: str = "", gpus: int = 1,
                 notices: NoticeLog | None = None) -> None:
        self.project, self.zones, self.opts = project, zones, opts
        self.instances, self.operations = clients["instances"], clients["operations"]
        self.machine_types, self.accelerator_types = clients["machine_types"], clients["accelerator_types"]
        self.image = image or DEFAULT_IMAGE
        self.accelerator = accelerator_type(gpu_type, opts.accelerator_type)
        self.gpu_type, self.gpus = gpu_type, gpus
        self.notices: NoticeLog = notices or MemoryNoticeLog()
        self._mt: dict[tuple[str, str], Any] = {}

    @classmethod
    def from_config(cls, opts: Any, zones: list[str], *, credentials_file: str | None = None,
                    endpoint_url: str | None = None, image: str | None = None, gpu_type: str = "",
                    gpus: int = 1, notices: NoticeLog | None = None) -> GcpProvider:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import compute_v1

        kw: dict[str, Any] = {"transport": "rest"}
        if endpoint_url:  # a local fake or emulator: no credentials needed
            kw["client_options"] = ClientOptions(api_endpoint=endpoint_url)
            kw["credentials"] = AnonymousCredentials()
        elif credentials_file:
            from google.oauth2 import service_account

            try:
                kw["credentials"] = service_account.Credentials.from_service_account_file(credentials_file)
            except (OSError, ValueError) as e:
                raise Fatal(f"GCP credentials: cannot use the service-account key {credentials_file} ({e}); "
                            "fix the pool's credentials (a key file path)") from None
        clients = {"instances": compute_v1.InstancesClient(**kw),
                   "operations": compute_v1.ZoneOperationsClient(**kw),
                   "machine_types": compute_v1.MachineTypesClient(**kw),
                   "accelerator_types": compute_v1.AcceleratorTypesClient(**kw)}
        return cls(opts.project, zones, clients, opts, image, gpu_type, gpus, notices)

    def _call(self, fn: Any, **kw: Any) -> Any:
        """fn(**kw) with its errors mapped, and without the client's own default retries on
        reads (`retrying` is the one retry layer here)."""
        from google.api_core.exceptions import GoogleAPICallError

        try:
            return fn(retry=None, **kw)
        except GoogleAPICallError as e:
            raise map_error(e) from e

    def _wait(self, op: Any, zone: str) -> None:
        """Await a zone operation (waiting again while it is RUNNING); its error (e.g.
        ZONE_RESOURCE_POOL_EXHAUSTED) is mapped."""
        from google.cloud.compute_v1 import Operation

        waits = 0
        while op.status != Operation.Status.DONE:
            if waits >= MAX_WAITS:
                raise Transient(f"GCP operation {op.name} in {zone} still {op.status.name} after "
                                f"{waits} waits (the next call finds its instance by name)")
            op = self._call(self.operations.wait, project=self.project, zone=zone, operation=op.name)
            waits += 1
        errors = [x.code for x in op.error.errors] if op.error and op.error.errors else []
        if errors:
            codes = ", ".join(errors)
            if any(c in CAPACITY for c in errors):
                raise NoCapacity(f"GCP {codes} in {zone}")
            raise Fatal(f"GCP operation {op.name} failed: {codes} (check the pool's settings)")

    # -- offers -------------------------------------------------------------------------------
    @retrying
    def offers(self) -> list[Offer]:
        """Machine types with their own GPUs in every zone of the pool."""
        out = []
        for zone in self.zones:
            for mt in self._call(self.machine_types.list, project=self.project, zone=zone):
                for acc in mt.accelerators:
                    out.append(Offer("gcp", zone.rsplit("-", 1)[0], zone, mt.name,
                                     acc.guest_accelerator_type, acc.guest_accelerator_count,
                                     "on_demand", None))
        return out

    # -- launch -------------------------------------------------------------------------------
    @retrying
    def launch(self, req: LaunchRequest) -> Instance:
        name = instance_name(req.node_id)
        found = self._find(name)
        if found is not None:
            return found
        zones = [req.zone] + [z for z in self.zones if z != req.zone] if req.zone else self.zones
        capacity, absent = [], []
        for zone in zones:
            try:
                return self._insert(req, name, zone)
            except NotInZone as e:
                absent.append(str(e))
            except NoCapacity as e:
                capacity.append(str(e))
        if capacity:
            raise NoCapacity(f"GCP: no capacity for {req.instance_type} in {', '.join(zones)}: "
                             f"{'; '.join(capacity + absent)} (another pool will be tried)")
        raise Fatal(f"GCP: {'; '.join(absent)} (set the pool's options.zones to zones that offer them)")

    def _insert(self, req: LaunchRequest, name: str, zone: str) -> Instance:
        from google.cloud import compute_v1 as c

        res = instance_resource(req, name, zone, self.opts, req.image or self.image,
                                self._accelerators(zone, req.instance_type))
        op = self._call(self.instances.insert_unary, request=c.InsertInstanceRequest(
            project=self.project, zone=zone, instance_resource=res,
            request_id=request_id(f"{req.token}/{zone}")))
        self._wait(op, zone)
        return read_instance(self._call(self.instances.get, project=self.project, zone=zone, instance=name))


    def _accelerators(self, zone: str, machine_type: str) -> list[tuple[str, int]]:
        """What to attach in `zone`: nothing for a machine type with its own GPUs, else the
        pool's accelerator type x gpus_per_node. Raises NotInZone if the zone lacks either."""
        key = (zone, machine_type)
        if key not in self._mt:
            mt = self._get(self.machine_types.get, zone=zone, machine_type=machine_type)
            if mt is None:
                raise NotInZone(f"machine type {machine_type} is not offered in {zone}")
            self._mt[key] = mt
        if self._mt[key].accelerators:
            return []
        if self.accelerator is None:
            raise Fatal(f"GCP: {machine_type} carries no GPUs and gpu_type {self.gpu_type!r} has no "
                        "known accelerator type: set the pool's options.accelerator_type")
        if self._get(self.accelerator_types.get, zone=zone, accelerator_type=self.accelerator) is None:
            raise NotInZone(f"accelerator {self.accelerator} is not offered in {zone} "
                            f"(zones that offer it: {', '.join(self._zones_offering()) or 'none'})")
        return [(self.accelerator, self.gpus)]

    def _get(self, fn: Any, **kw: Any) -> Any:
        """fn(project=..., **kw), None if the resource does not exist (other errors mapped)."""
        from google.api_core.exceptions import NotFound

        try:
            return self._call(fn, project=self.project, **kw)
        except Fatal as e:
            if isinstance(e.__cause__, NotFound):
                return None
            raise

    def _zones_offering(self) -> list[str]:
        from google.cloud.compute_v1 import AggregatedListAcceleratorTypesRequest

        req = AggregatedListAcceleratorTypesRequest(project=self.project, filter=f'name="{self.accelerator}"')
        pages = self._call(self.accelerator_types.aggregated_list, request=req)
        return sorted(scope.rsplit("/", 1)[-1] for scope, found in pages
                      if any(a.name == self.accelerator for a in found.accelerator_types))

    def _find(self, name: str) -> Instance | None:
        """The live instance of this name in any of the pool's zones."""
        for zone in self.zones:
            found = self._get(self.instances.get, zone=zone, instance=name)
            if found is not None and (inst := read_instance(found)).state != InstanceState.GONE:
                return inst
        return None

    # -- the rest of the contract ---------------------------------------------------------------
    @retrying
    def terminate(self, instance_id: str) -> None:
        zone, name = split_id(instance_id)
        if zone is None:  # a bare name (recorded before ids were zone-qualified)
            found = self._find(name)
            if found is None:
                return
            zone = found.zone or self.zones[0]
        op = self._get(self.instances.delete_unary, zone=zone, instance=name)
        if op is not None:
            self._wait(op, zone)

    @retrying
    def poll(self, broker_id: str) -> list[Instance]:
        from google.cloud.compute_v1 import AggregatedListInstancesRequest

        label = label_value(broker_id)
        out = []
        pages = self._call(self.instances.aggregated_list, request=AggregatedListInstancesRequest(
            project=self.project, filter=f"labels.{TAG_BROKER}={label}"))
        for _zone, scoped in pages:
            for i in scoped.instances:
                if i.labels.get(TAG_BROKER) == label:
                    inst = read_instance(i)
                    if inst.state != InstanceState.GONE:
                        out.append(inst)
        return sorted(out, key=lambda x: x.instance_id)

    @retrying
    def interruptions(self) -> list[Interruption]:
        """New `compute.instances.preempted` operations in every zone, oldest first."""
        from google.cloud.compute_v1 import ListZoneOperationsRequest

        out = []
        for zone in self.zones:
            new = []
            ops = self._call(self.operations.list, request=ListZoneOperationsRequest(
                project=self.project, zone=zone, filter=PREEMPTED, order_by="creationTimestamp desc"))
            for op in ops:
                if self.notices.seen(op.name):
                    break  # newest first: everything older was acknowledged before
                new.append(op)
            for op in reversed(new):
                iid = instance_id(zone, op.target_link.rsplit("/", 1)[-1])
                out.append(Interruption(iid, "preempted", key=op.name, receipt=zone))
        return out

    def ack(self, notices: list[Interruption]) -> None:
        """The broker recorded these: note them in the notice log, so they are not read again
        (preemption operations are a log, not a queue; until acknowledged, a notice is
        returned again: at-least-once)."""
        for n in notices:
            if n.key is not None:
                self.notices.add(n.key, n.instance_id, n.kind, n.receipt or "")

    @retrying
    def describe(self, instance_id: str) -> Instance | None:
        """The instance by id (zone-qualified, or a bare name looked up in the pool's zones),
        None when it is gone or unknown."""
        zone, name = split_id(instance_id)
        if zone is None:
            return self._find(name)
        found = self._get(self.instances.get, zone=zone, instance=name)
        if found is None:
            return None
        inst = read_instance(found)
        return None if inst.state == InstanceState.GONE else inst
