"""Capacity providers: every backend behind one small contract (see providers.base)."""

KNOWN_PROVIDERS = frozenset({"local", "aws", "gcp", "libcloud"})
