"""Checkpoints in object storage: the commit protocol, the index, resume, transfer, uploads, telemetry."""
