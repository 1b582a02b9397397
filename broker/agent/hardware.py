"""What GPUs this host has: nvidia-smi when present, else what the operator said."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpus:
    count: int
    gpu_type: str
    names: tuple[str, ...] = ()
    source: str = "flags"  # nvidia-smi | flags


def detect(gpus: int | None, gpu_type: str | None) -> Gpus:
    """The host's GPUs. With nvidia-smi, its list (the count is capped at `gpus` if given, the
    type is `gpu_type` if given, else the first GPU's name); without, the flags. Raises
    ValueError when neither tells (no nvidia-smi and no --gpus)."""
    names = _nvidia_smi()
    if names:
        n = len(names) if gpus is None else min(gpus, len(names))
        return Gpus(n, gpu_type or names[0], tuple(names), "nvidia-smi")
    if gpus is None:
        raise ValueError("--gpus: this host has no nvidia-smi; say how many GPUs it offers "
                         "(and --gpu-type)")
    return Gpus(gpus, gpu_type or "GPU")


def _nvidia_smi() -> list[str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]
