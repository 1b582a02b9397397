"""A job's code snapshot follows it to the store of the pool its attempt runs in (issue 26),
the way its checkpoints do: nodes of a pool fetch from the pool's store (which they reach),
not from wherever the snapshot was uploaded (the broker's default store, maybe a folder on
the server). The copy is made once per (store, team, digest), verified on the way
(broker.checkpoint.code_store.put checks the sha256), before the attempt's ranks start.

A prepared archive (`code: URI#sha256=...`) is fetched by nodes as named: it is not copied.
A copy that fails (the source missing or damaged, the destination unwritable) leaves the
original URI: the node's fetch then fails with its cause (providers.code_cache), which says
what happened on the job's attempt instead of the broker's log only.
"""

from __future__ import annotations

import json
import logging

from broker.checkpoint import code_store
from broker.checkpoint.checkpoints import store_root_of
from broker.codepack import SHA_ENV, URI_ENV
from broker.state.model import Job
from providers.code_cache import fsspec_fetch
from providers.data_cache import DATA_ENV
from providers.setup_runner import SETUP_ENV

log = logging.getLogger("onepool.code")


def code_env(job: Job, attempt_prefix: str) -> dict[str, str]:
    """The ranks' environment naming the job's snapshot (none without one, or with `workdir`),
    copied into the store holding `attempt_prefix` first when it is elsewhere, its setup
    commands (providers.setup_runner) and its data (providers.data_cache)."""
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
            if code_store.put(root, job.team, sha, fsspec_fetch(uri)):
                log.info("code: sha256:%s of job %s copied from %s to %s", sha, job.id, uri, want)
            uri = want
        except (OSError, ValueError) as e:
            log.warning("code: sha256:%s of job %s could not be copied from %s to %s (%s); its "
                        "nodes fetch it from where it is", sha, job.id, uri, want, e)
    return {**setup, SHA_ENV: sha, URI_ENV: uri}
