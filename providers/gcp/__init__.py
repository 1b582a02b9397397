"""GCP Compute Engine capacity through google-cloud-compute (see providers.gcp.compute)."""

from providers.gcp.compute import GcpProvider, map_error

__all__ = ["GcpProvider", "map_error"]
