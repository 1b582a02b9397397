"""Capacity providers: every backend behind one small contract (see providers.base)."""

KNOWN_PROVIDERS = frozenset({"local", "agent", "aws", "gcp", "libcloud", "slurm"})
"""local: GPU slots of the broker's own machine. agent: on-prem hosts running `onepool agent`.
aws, gcp, libcloud: rented nodes, each booting `onepool agent` from its user data.
slurm: a partition of an existing Slurm cluster (providers.slurm), one sbatch job per attempt."""
