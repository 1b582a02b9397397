"""httpx without its command-line client (issue 27: a CLI that starts fast).

httpx's __init__ imports httpx._main, its own CLI, which loads click, rich's live display and
pygments: about 40% of httpx's import time, paid by every `onepool` command over HTTP for a
feature it never uses. httpx falls back to a stub `main` when that import fails, so importing
this module first blocks httpx._main for the one import of httpx and then unblocks it (a later
`import httpx._main` works as usual). Where httpx is already imported, nothing changes.
"""

from __future__ import annotations

import sys
from types import ModuleType


def import_httpx() -> ModuleType:
    """The httpx module, imported without httpx._main unless something imported it before."""
    if "httpx" in sys.modules:
        return sys.modules["httpx"]
    blocked = "httpx._main" not in sys.modules
    if blocked:
        sys.modules["httpx._main"] = None  # type: ignore[assignment]  # import fails: httpx's stub
    try:
        import httpx
    finally:
        if blocked:
            del sys.modules["httpx._main"]
    return httpx


import_httpx()
