"""A job's code snapshot follows it to the store of the pool its attempt runs in (issue 26),
the way its checkpoints do: nodes of a pool fetch from the pool's store (which they reach),
not from wherever the snapshot was uploaded (the broker's default store, maybe a folder on
the server). The copy is made once per (store, team, digest), verified on the way
(broker.checkpoint.code_store.put checks the sha256), before the attempt's ranks start.

The copy is charged as egress like a checkpoint's (broker.checkpoint.resume): its bytes and
their price (pricing.egress, from the source store's provider to the destination's) are added
to the attempt that needed it (`egress_bytes`, `egress_usd`, which the ledger charges to its job
and team) and told in a `code_copied` event. A snapshot already in the destination costs nothing.

A prepared archive (`code: URI#sha256=...`) is fetched by nodes as named: it is not copied.
A copy that fails (the source missing or damaged, the destination unwritable) leaves the
original URI: the node's fetch then fails with its cause (providers.code_cache), which says
what happened on the job's attempt instead of the broker's log only.
"""

from __future__ import annotations

import json
import logging

from sqlalchemy.orm import object_session

from broker.checkpoint import code_store
from broker.checkpoint.checkpoints import store_root_of
from broker.checkpoint.index import locate
from broker.codepack import SHA_ENV, URI_ENV
from broker.spec import ClusterConfig
from broker.state.events import record
from broker.state.model import Attempt, Job
from pricing.egress import egress_usd
from providers.code_cache import fsspec_fetch
from providers.data_cache import DATA_ENV
from providers.setup_runner import SETUP_ENV

log = logging.getLogger("onepool.code")
Charge = tuple[Attempt, ClusterConfig, float]  # the attempt a copy's egress goes to, the config, now


def code_env(job: Job, attempt_prefix: str, charge: Charge | None = None) -> dict[str, str]:
    """The ranks' environment naming the job's snapshot (none without one, or with `workdir`),
    copied into the store holding `attempt_prefix` first when it is elsewhere (with `charge`:
    its egress added to that attempt, see the module's doc), its setup commands
    (providers.setup_runner) and its data (providers.data_cache)."""
    setup = {SETUP_ENV: json.dumps(list(job.setup))} if job.setup else {}
    if job.data:
        setup[DATA_ENV] = json.dumps(dict(job.data))
    if job.workdir or not job.code_sha256 or not job.code_uri:
        return setup
    sha, uri = job.code_sha256, job.code_uri
    root = store_root_of(attempt_prefix)
    want = code_store.code_uri(root, job.team, sha)
    ours = uri.endswith(f"/code/{job.team}/{sha}.tar.gz")  # uploaded through onepool, not prepared
    if ours and uri != want:
        try:
            data = fsspec_fetch(uri)
            if code_store.put(root, job.team, sha, data):
                log.info("code: sha256:%s of job %s copied from %s to %s", sha, job.id, uri, want)
                if charge is not None:
                    _charge(charge, job, sha, len(data), uri.rsplit(f"/code/{job.team}/", 1)[0], root)
            uri = want
        except (OSError, ValueError) as e:
            log.warning("code: sha256:%s of job %s could not be copied from %s to %s (%s); its "
                        "nodes fetch it from where it is", sha, job.id, uri, want, e)
    return {**setup, SHA_ENV: sha, URI_ENV: uri}


def _charge(charge: Charge, job: Job, sha: str, nbytes: int, src: str, dst: str) -> None:
    a, config, now = charge
    usd = egress_usd(nbytes, locate(config, src), locate(config, dst))
    a.egress_bytes += nbytes
    a.egress_usd += usd
    s = object_session(a)
    if s is None:  # (an attempt outside a session: its columns only)
        return
    s.add(a)
    record(s, now, "code_copied", f"code snapshot sha256:{sha[:12]} ({nbytes} bytes) copied from {src} "
           f"to {dst}: egress ${usd:.6f}", job_id=job.id, attempt_id=a.id, sha256=sha, bytes=nbytes,
           egress_usd=usd, **{"from": src, "to": dst})
