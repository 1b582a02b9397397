"""A submit's `code` (issue 26, broker.spec_code) resolved by the embedded client and the
server: a folder is packed and stored (embedded only: over the API the client packs and
uploads it first), a snapshot must be in the store already, an archive is taken as named."""

from __future__ import annotations

import os
from dataclasses import dataclass

from broker.checkpoint import code_store
from broker.codepack import NONE, EmptySnapshot, SnapshotTooLarge, pack, parse_code
from broker.errors import SpecError
from broker.spec import JobSpec


@dataclass(frozen=True)
class ResolvedCode:
    spec: JobSpec  # `code` replaced by sha256:... when a folder was packed
    sha256: str | None
    uri: str | None


def resolve_code(js: JobSpec, *, local: bool, store_root: str) -> ResolvedCode:
    """Resolve `js.code` against the store at `store_root`. `local`: the submitter is on this
    machine (it may name a folder of it). Raises SpecError naming `code`."""
    if js.code is None or js.code == NONE:
        return ResolvedCode(js, None, None)
    ref = parse_code(js.code)
    if ref.kind == "folder":
        if not local:
            raise SpecError("job", [f"code: {js.code!r} is a folder of the submitter's machine: the "
                                    "client packs it and uploads it (PUT /v1/code/SHA256), then submits "
                                    "code: sha256:SHA256"])
        folder = os.path.abspath(os.path.expanduser(ref.folder or "."))
        try:
            snap = pack(folder)
        except (SnapshotTooLarge, EmptySnapshot, NotADirectoryError) as e:
            raise SpecError("job", [str(e)]) from e
        code_store.put(store_root, js.team, snap.sha256, snap.data)
        return ResolvedCode(js.model_copy(update={"code": snap.ref}), snap.sha256,
                            code_store.code_uri(store_root, js.team, snap.sha256))
    if ref.kind == "snapshot":
        assert ref.sha256 is not None
        if not code_store.has(store_root, js.team, ref.sha256):
            raise SpecError("job", [f"code: team {js.team} has no snapshot sha256:{ref.sha256} in the "
                                    "store: upload it first (PUT /v1/code/SHA256), or name a folder"])
        return ResolvedCode(js, ref.sha256, code_store.code_uri(store_root, js.team, ref.sha256))
    return ResolvedCode(js, ref.sha256, ref.uri)
