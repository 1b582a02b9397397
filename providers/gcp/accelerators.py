"""GPUs on GCP: which machine types carry their own, and the accelerator type to attach to
the others (pure data; providers.gcp.compute checks it against the zone at launch).

Accelerator-optimized machine types (a2, a3, a4, g2, ...) come with their GPUs
(`MachineType.accelerators` lists them). General-purpose N1 types get GPUs only as
`guest_accelerators`: T4, V100, P100, P4 (and K80, retired) attach to N1 VMs, in the zones
that offer them. An accelerator type is a zonal resource
(`zones/{zone}/acceleratorTypes/{name}`), so the launch names it for the zone it tries.
"""

from __future__ import annotations

ACCELERATOR_TYPES: dict[str, str] = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
    "K80": "nvidia-tesla-k80",
    "L4": "nvidia-l4",
    "A100": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "H100": "nvidia-h100-80gb",
}
"""onepool gpu_type -> GCP accelerator type (set options.accelerator_type for another)."""

ACCELERATOR_OPTIMIZED = ("a2-", "a3-", "a4-", "a4x-", "g2-", "g4-")
"""Machine type families that carry their GPUs (checked again against the API at launch)."""


def accelerator_type(gpu_type: str, override: str | None = None) -> str | None:
    """The accelerator type to attach for a pool's gpu_type (None if unknown)."""
    return override or ACCELERATOR_TYPES.get(gpu_type) or ACCELERATOR_TYPES.get(gpu_type.upper())


def carries_gpus(machine_type: str) -> bool:
    """Whether the machine type's family is accelerator-optimized (by name)."""
    return machine_type.startswith(ACCELERATOR_OPTIMIZED)
