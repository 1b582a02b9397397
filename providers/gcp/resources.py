"""The Compute Engine instance resource onepool asks for, and the Instance it reads back.

- name: providers.names.instance_name(node id) (RFC 1035, deterministic).
- labels: the broker's ids as valid label values (for filtering and billing reports);
  metadata items: the same ids verbatim (what poll() reads back), and `startup-script`,
  the boot script that starts the agent.
- scheduling: on_host_maintenance=TERMINATE always (GPU VMs cannot live-migrate);
  SPOT adds provisioning_model=SPOT, instance_termination_action=DELETE, no restart.
- guest_accelerators: for machine types without their own GPUs (N1 + T4/V100/P100...).
- service_accounts: the pool's service account with its scopes (Cloud Storage for
  checkpoints by default).
- boot disk: the pool's image (an image family by default), options.root_volume_gb.
- network: options.network / subnetwork, an external IP only with options.external_ip, and
  options.network_tags (firewall rules target them; infra/gcp lets nodes of a multi-node job
  talk to each other and nothing else in).
"""

from __future__ import annotations

from typing import Any

from providers.base import TAG_BROKER, TAG_JOB, TAG_NODE, TAG_POOL, Instance, InstanceState, LaunchRequest
from providers.names import label_value

STATES = {"PROVISIONING": InstanceState.PENDING, "STAGING": InstanceState.PENDING,
          "RUNNING": InstanceState.RUNNING, "STOPPING": InstanceState.STOPPING,
          "SUSPENDING": InstanceState.STOPPING, "SUSPENDED": InstanceState.STOPPING,
          "STOPPED": InstanceState.GONE, "TERMINATED": InstanceState.GONE}
TAGS = (TAG_BROKER, TAG_POOL, TAG_NODE, TAG_JOB)
DEFAULT_IMAGE = ("projects/deeplearning-platform-release/global/images/family/"
                 "common-cu129-ubuntu-2204-nvidia-580")


def instance_resource(req: LaunchRequest, name: str, zone: str, opts: Any, image: str,
                      accelerators: list[tuple[str, int]]) -> Any:
    """The compute_v1.Instance to insert in `zone`. `opts` is the pool's GcpOptions;
    `accelerators` the (accelerator type, count) pairs to attach."""
    from google.cloud import compute_v1 as c

    sched = c.Scheduling(on_host_maintenance="TERMINATE")
    if req.market == "spot":
        sched = c.Scheduling(provisioning_model="SPOT", instance_termination_action="DELETE",
                             on_host_maintenance="TERMINATE", automatic_restart=False)
    tags = req.tags()
    nic = c.NetworkInterface(network=opts.network)
    if opts.subnetwork:
        nic.subnetwork = opts.subnetwork
    if opts.external_ip:
        nic.access_configs = [c.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    return c.Instance(
        name=name, machine_type=f"zones/{zone}/machineTypes/{req.instance_type}",
        labels={k: label_value(v) for k, v in tags.items()}, scheduling=sched,
        metadata=c.Metadata(items=[c.Items(key="startup-script", value=req.user_data),
                                   *(c.Items(key=k, value=v) for k, v in tags.items())]),
        guest_accelerators=[c.AcceleratorConfig(accelerator_type=f"zones/{zone}/acceleratorTypes/{t}",
                                                accelerator_count=n) for t, n in accelerators],
        service_accounts=[c.ServiceAccount(email=opts.service_account, scopes=list(opts.scopes))],
        disks=[c.AttachedDisk(boot=True, auto_delete=True,
                              initialize_params=c.AttachedDiskInitializeParams(
                                  source_image=image, disk_size_gb=opts.root_volume_gb))],
        network_interfaces=[nic], tags=c.Tags(items=list(opts.network_tags)))


def instance_id(zone: str, name: str) -> str:
    """onepool's id of a GCP instance: zone-qualified, since names are unique per zone."""
    return f"{zone}/{name}"


def split_id(iid: str) -> tuple[str | None, str]:
    """(zone, name) of an instance id; zone None for a bare name."""
    zone, _, name = iid.rpartition("/")
    return zone or None, name


def read_instance(i: Any) -> Instance:
    """compute_v1.Instance -> Instance, the broker's ids taken from metadata (verbatim), else
    from labels."""
    meta = {it.key: it.value for it in (i.metadata.items if i.metadata else [])}
    labels = dict(i.labels)
    tags = {k: meta.get(k, labels.get(k, "")) for k in TAGS if k in meta or k in labels}
    zone = i.zone.rsplit("/", 1)[-1] if i.zone else ""
    spot = bool(i.scheduling) and i.scheduling.provisioning_model == "SPOT"
    return Instance(instance_id(zone, i.name), STATES.get(i.status, InstanceState.PENDING), tags,
                    zone or None, "spot" if spot else "on_demand")


def startup_script(i: Any) -> str | None:
    """The boot script an instance runs (its `startup-script` metadata), None if it has none."""
    return next((it.value for it in (i.metadata.items if i.metadata else []) if it.key == "startup-script"),
                None)
