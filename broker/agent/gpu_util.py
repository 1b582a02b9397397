"""Reading GPU utilization on a node: a small seam (`Reader.read()`: percent busy per GPU
index) with NVML behind it (nvidia-ml-py), the default on nodes that have NVML, and a test
double that reads a JSON file. The agent samples it every SAMPLE_S seconds and sends each
rank's mean with its heartbeats (broker.utilization keeps it on the server)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Protocol

log = logging.getLogger("onepool.agent")
SAMPLE_S = 2.0
FILE_ENV = "ONEPOOL_GPU_UTIL_FILE"


class Reader(Protocol):
    def read(self) -> dict[int, float]:
        """Utilization (percent of the last sample period a kernel ran) per GPU index. Raises
        OSError or ValueError when it cannot be read now (the agent tries again later)."""
        ...


class NvmlReader:
    """NVML's utilization rates (nvmlDeviceGetUtilizationRates(...).gpu) of every GPU."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def read(self) -> dict[int, float]:
        try:
            return {i: float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu)
                    for i, h in enumerate(self._handles)}
        except self._nvml.NVMLError as e:
            raise OSError(f"NVML: {e}") from e


class FileReader:
    """The test double (and a way to feed utilization from another tool): a JSON object
    {"GPU index": percent} in a file, read at every sample."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> dict[int, float]:
        data = json.loads(self.path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{self.path}: must hold a JSON object {{\"GPU index\": percent}}")
        out = {int(k): float(v) for k, v in data.items()}
        if any(not 0.0 <= v <= 100.0 for v in out.values()):
            raise ValueError(f"{self.path}: percentages must be within 0 and 100")
        return out


def default_reader() -> Reader | None:
    """$ONEPOOL_GPU_UTIL_FILE's FileReader if set; else NVML where its library loads; else None
    (no utilization is reported)."""
    path = os.environ.get(FILE_ENV)
    if path:
        return FileReader(Path(path))
    try:
        import pynvml
    except ImportError:
        return None
    try:
        return NvmlReader()
    except pynvml.NVMLError as e:
        log.info("agent: no GPU utilization (NVML: %s)", e)
        return None


def gpus_of(env: dict[str, str]) -> tuple[int, ...]:
    """The GPU indices a rank holds, from its CUDA_VISIBLE_DEVICES (the broker's slots)."""
    raw = env.get("CUDA_VISIBLE_DEVICES", "")
    return tuple(int(x) for x in raw.split(",") if x.strip().isdigit())
