"""Names and labels that clouds accept, made from onepool's ids.

onepool names (pools, and nodes `{pool}-{8 hex}`) allow lowercase letters, digits, '_', '.'
and '-', may start with a digit and reach 72 characters. Clouds are stricter:
- instance names: GCP wants RFC 1035 (`[a-z]([-a-z0-9]*[a-z0-9])?`, at most 63 characters),
  Azure VM names take no '_' or '.'; `instance_name` satisfies both.
- GCP label values: `[a-z0-9_-]`, at most 63 characters (`label_value`).

Both are deterministic. An id that is already valid is kept as it is; any other id is
rewritten and gets a hash of the original appended, so two different ids never share a
name. The original ids travel beside the name (GCP metadata, libcloud tags), so nothing has
to be recovered from a rewritten name.
"""

from __future__ import annotations

import hashlib
import re

RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]*$")
MAX_LEN = 63


def _digest(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()[:8]


def instance_name(node_id: str, max_len: int = MAX_LEN) -> str:
    """A valid instance name for `node_id`: the id itself when valid, else a rewrite plus a
    hash of the id (`5pool.a-1b2c3d4e` -> `n-5pool-a-1b2c3d4e-<hash>`)."""
    if len(node_id) <= max_len and RFC1035.match(node_id):
        return node_id
    s = re.sub(r"[^a-z0-9-]+", "-", node_id.lower()).strip("-")
    if not s[:1].isalpha():
        s = f"n-{s}"
    s = s[: max_len - 9].rstrip("-")
    return f"{s}-{_digest(node_id)}"


def label_value(value: str) -> str:
    """A valid GCP label value for `value`: kept when valid, else lowercased with other
    characters as '-' (and cut to 63 characters with a hash of the original)."""
    if len(value) <= MAX_LEN and LABEL_VALUE.match(value):
        return value
    s = re.sub(r"[^a-z0-9_-]", "-", value.lower())
    return s if len(s) <= MAX_LEN else f"{s[:MAX_LEN - 9]}-{_digest(value)}"


def is_instance_name(name: str) -> bool:
    """Whether `name` is usable as it is (no rewrite needed)."""
    return instance_name(name) == name
