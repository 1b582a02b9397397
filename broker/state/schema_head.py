"""The newest migration revision, read from the migration files without importing Alembic or
SQLAlchemy (a CLI that only reads must not pay for them when the schema is already current)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

VERSIONS = Path(__file__).with_name("migrations") / "versions"
_REV = re.compile(r"^(down_revision|revision)\s*=\s*['\"]([^'\"]*)['\"]", re.MULTILINE)


@cache
def head_revision(versions: Path = VERSIONS) -> str | None:
    """The revision no other migration revises (None if there is not exactly one: let Alembic
    decide)."""
    revs: set[str] = set()
    downs: set[str] = set()
    for f in versions.glob("*.py"):
        found = dict(m.groups() for m in _REV.finditer(f.read_text()))
        if "revision" in found:
            revs.add(found["revision"])
            downs.add(found.get("down_revision", ""))
    heads = revs - downs
    return next(iter(heads)) if len(heads) == 1 else None
