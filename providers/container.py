"""A rank in an OCI container (issue 26): the `podman run` / `docker run` that a job with an
`image:` runs in place of its bare command, under the same supervisor (providers.local_runner).

Who sets what:
- the broker, per attempt (broker.control.engine): ONEPOOL_IMAGE (the job's image) and, when
  its pool names one, ONEPOOL_CONTAINER_RUNTIME (podman | docker);
- the node's operator (the server's or the agent's environment, never the job's):
  ONEPOOL_CONTAINER_CLI (the executable; default: the named runtime, else podman, else docker,
  found on PATH), ONEPOOL_CONTAINER_GPUS (cdi | gpus | none; default cdi for podman, gpus for
  docker) and ONEPOOL_CONTAINER_ARGS (more `run` arguments, shell-split: `--shm-size=16g`, or a
  test machine's quirks).

What the container gets (build_run): the job's command, its environment (its own variables,
the broker's ONEPOOL_* contract, HOME and TMPDIR in its job folder; PATH stays the image's),
its working directory and job folder mounted read-write at the same paths, a file:// checkpoint
store mounted likewise, this node's `broker` package read-only at /opt/onepool/lib (on
PYTHONPATH, so `broker.runtime` inside matches the node's version: the image needs Python 3.11+
with numpy and fsspec), its GPUs (CDI `--device nvidia.com/gpu=N`, or docker's `--gpus`,
renumbered from 0 inside as CUDA does), the host's network (NCCL between nodes), `--init` (an
init as PID 1 that passes SIGTERM and SIGUSR1 on to the job: the runtime's signal proxy delivers
the ones sent to the supervisor's process group), and the rank's user when isolation drops
privileges. Nothing of the node's credentials: no host variable the isolation does not pass,
no host folder but these. The container is named after the rank, removed when it exits
(`--rm`), and by name once more by whoever sees the rank end (a dead supervisor cannot).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from providers.image_pull import deaf_to_usr1, pull_image, record

IMAGE_ENV = "ONEPOOL_IMAGE"
RUNTIME_ENV = "ONEPOOL_CONTAINER_RUNTIME"
CLI_ENV = "ONEPOOL_CONTAINER_CLI"
GPUS_ENV = "ONEPOOL_CONTAINER_GPUS"
ARGS_ENV = "ONEPOOL_CONTAINER_ARGS"
HOST_SETTINGS = (CLI_ENV, GPUS_ENV, ARGS_ENV)
KINDS = ("podman", "docker")
GPU_MODES = ("cdi", "gpus", "none")
LOOKUP_S = 120.0  # an image lookup, a removal
LIB_DIR = "/opt/onepool/lib"  # where the node's `broker` package is mounted (read-only)
BROKER_PACKAGE = Path(__file__).resolve().parent.parent / "broker"
# Variables the runtime's own process needs from the host (rootless podman, a remote docker):
# never passed into the container.
CLI_HOST_VARS = ("HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "DOCKER_HOST", "DOCKER_CONFIG",
                 "CONTAINERS_CONF", "CONTAINERS_REGISTRIES_CONF", "CONTAINERS_STORAGE_CONF",
                 "REGISTRY_AUTH_FILE", "TMPDIR")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_NOT_INTO_CONTAINER = ("PATH",)  # the image's own PATH finds its interpreter


class ContainerSetupError(ValueError):
    """This node cannot run containers as asked (no runtime, a bad host setting): `kind` is the
    start-failure kind (providers.start_errors); another node may succeed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def container_env(image: str | None, runtime: str | None) -> dict[str, str]:
    """The broker's variables for an attempt of a job with this image on a pool with this
    runtime (nothing for a job without an image)."""
    if not image:
        return {}
    return {IMAGE_ENV: image, **({RUNTIME_ENV: str(runtime)} if runtime else {})}


@dataclass(frozen=True)
class Runtime:
    """The container CLI of this node: its dialect (podman | docker), its executable, how it
    hands over GPUs, and the operator's extra `run` arguments."""

    kind: str
    cli: str
    gpus: str
    extra: tuple[str, ...] = ()

    @classmethod
    def resolve(cls, named: str | None, host: Mapping[str, str] | None = None) -> Runtime:
        """The runtime for a rank: `named` (the pool's choice) or whichever the node has, the
        executable from ONEPOOL_CONTAINER_CLI or PATH. Raises ContainerSetupError."""
        h = os.environ if host is None else host
        if named is not None and named not in KINDS:
            raise ContainerSetupError("no_container_runtime", f"container_runtime: must be one of "
                                      f"{', '.join(KINDS)} on this node (got {named!r})")
        cli = h.get(CLI_ENV) or ""
        kind = named
        if cli:
            kind = kind or ("docker" if "docker" in Path(cli).name else "podman")
            if shutil.which(cli) is None:
                raise ContainerSetupError("no_container_runtime", f"{CLI_ENV}: {cli!r} is not an "
                                          "executable on this node")
        else:
            for k in ([kind] if kind else list(KINDS)):
                found = shutil.which(k, path=h.get("PATH") or None)
                if found:
                    kind, cli = k, found
                    break
            else:
                raise ContainerSetupError("no_container_runtime", "this node has no container "
                                          f"runtime ({named or 'podman or docker'}) on its PATH")
        assert kind is not None
        gpus = h.get(GPUS_ENV) or ("cdi" if kind == "podman" else "gpus")
        if gpus not in GPU_MODES:
            raise ContainerSetupError("no_container_runtime", f"{GPUS_ENV}: must be one of "
                                      f"{', '.join(GPU_MODES)} (got {gpus!r})")
        try:
            extra = tuple(shlex.split(h.get(ARGS_ENV, "")))
        except ValueError as e:
            raise ContainerSetupError("no_container_runtime", f"{ARGS_ENV}: {e}") from None
        return cls(kind, cli, gpus, extra)

    def cli_env(self, host: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of the CLI's own process: a system PATH and the host variables it
        needs (rootless podman's runtime folder, a remote docker), nothing of the job's."""
        h = os.environ if host is None else host
        home = h.get("HOME") or pwd.getpwuid(os.geteuid()).pw_dir
        return {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "HOME": home,
                **{k: h[k] for k in CLI_HOST_VARS if k in h}}


def node_runtime() -> tuple[str, str, dict[str, str]] | None:
    """(cli, kind, its environment) of this node's container runtime, None without one (for
    providers.image_pull.HeldImages)."""
    try:
        rt = Runtime.resolve(None)
    except ContainerSetupError:
        return None
    return rt.cli, rt.kind, rt.cli_env()


def container_name(run_dir: Path) -> str:
    """A name unique to the rank's run folder (across attempts and broker homes)."""
    return "onepool-" + hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:24]


def gpu_args(rt: Runtime, visible: str) -> tuple[list[str], str | None]:
    """The flags that hand the rank's GPU slots (CUDA_VISIBLE_DEVICES on the node) to the
    container, and CUDA_VISIBLE_DEVICES inside it (renumbered from 0; None: unchanged)."""
    slots = [s for s in visible.split(",") if s.strip()]
    if rt.gpus == "none" or not slots:
        return [], None
    inside = ",".join(str(i) for i in range(len(slots)))
    if rt.gpus == "cdi":
        return [a for s in slots for a in ("--device", f"nvidia.com/gpu={s}")], inside
    return ["--gpus", f'"device={",".join(slots)}"'], inside


def store_path(uri: str | None) -> str | None:
    """The folder of a file:// (or plain path) checkpoint prefix, to mount; None for a bucket."""
    if not uri:
        return None
    u = urlparse(uri)
    if u.scheme not in ("", "file"):
        return None
    return u.path if u.scheme else uri


def env_file(env: Mapping[str, str]) -> str:
    """The container's environment as an env file (`--env-file`: one NAME=VALUE a line, read
    by the runtime, never on a command line other users can read, never in the environment of
    the runtime's own process, which a job's LD_PRELOAD or CONTAINERS_CONF would take over).
    Raises ContainerSetupError (kind invalid_command) for a value with a line break, which
    that format cannot carry."""
    bad = sorted(k for k, v in env.items() if "\n" in v or "\r" in v)
    if bad:
        raise ContainerSetupError("invalid_command", f"environment variable {bad[0]!r} holds a line "
                                  "break, which a container's environment cannot carry")
    return "".join(f"{k}={v}\n" for k, v in sorted(env.items()))


def build_run(rt: Runtime, image: str, argv: list[str], env: Mapping[str, str], *, cwd: str,
              job_dir: Path, run_dir: Path, user: tuple[int, int] | None, rootless: bool,
              env_path: Path, read_only: Sequence[str] = (), setup: bool = False) -> tuple[list[str], str]:
    """The `run` command line of a rank and the text of its env file (to be written at
    `env_path`, private to the broker). `env` is the rank's whole environment
    (providers.isolation); `user` (uid, gid) the rank's user when isolation drops privileges;
    `read_only` more host folders mounted read-only at their paths (the node's data cache, which
    the rank's `data` links point into). With `setup`, the container that runs the job's setup
    (run_setup): kept after it exits (to be committed), named `<rank's name>-setup`, and as the
    image's own user (root inside a rootless podman is this node's user, so a setup may install
    into the image) unless isolation names the rank's user."""
    inner = {k: v for k, v in env.items() if k not in _NOT_INTO_CONTAINER}
    gflags, visible = gpu_args(rt, env.get("CUDA_VISIBLE_DEVICES", ""))
    if visible is not None:
        inner["CUDA_VISIBLE_DEVICES"] = visible
    inner["PYTHONPATH"] = ":".join(p for p in (env.get("PYTHONPATH"), LIB_DIR) if p)
    name = container_name(run_dir) + ("-setup" if setup else "")
    cmd = [rt.cli, "run", *([] if setup else ["--rm"]), "--name", name, "--init", "--sig-proxy=true",
           "--pull=never", "--network=host", "--label", f"onepool.rank={run_dir.resolve()}",
           "--workdir", cwd, "--env-file", str(env_path)]
    if user is not None:
        cmd += ["--user", f"{user[0]}:{user[1]}"]
    elif rootless and rt.kind == "podman" and not setup:
        cmd += ["--userns=keep-id"]  # the job's files in the mounted folders stay this user's
    mounts = dict.fromkeys([str(job_dir), cwd, store_path(env.get("ONEPOOL_CHECKPOINT_URI"))])
    for m in mounts:
        if m:
            cmd += ["--volume", f"{m}:{m}:rw"]
    for m in dict.fromkeys(read_only):
        if m not in mounts:
            cmd += ["--volume", f"{m}:{m}:ro"]
    cmd += ["--volume", f"{BROKER_PACKAGE}:{LIB_DIR}/broker:ro"]
    return [*cmd, *gflags, *rt.extra, image, *argv], env_file(inner)


SETUP_IMAGE = "localhost/onepool-setup"  # derived images: the job's image after its setup ran


def setup_image(digest: str) -> str:
    """The derived image of a setup digest (providers.rank_prep.setup_digest: image, code, commands)."""
    return f"{SETUP_IMAGE}:{digest[:48]}"


def setup_argv(commands: Sequence[str]) -> list[str]:
    """What the setup container runs: the commands in order with `/bin/sh -c` (an image may
    have no bash), stopping at the first that fails (`set -e`), each echoed first (`set -x`)."""
    return ["/bin/sh", "-c", "set -ex\n" + "\n".join(commands)]


class SetupFailed(Exception):
    """The job's setup failed in its container: `code` is its exit status (the job's failure)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"setup failed with exit status {code}")
        self.code = code


def plan(d: Path, argv: list[str], env: Mapping[str, str], launch: Mapping[str, Any], job_dir: Path,
         tags: Mapping[str, str], setup: Mapping[str, Any] | None,
         read_only: Sequence[str]) -> dict[str, Any]:
    """How the rank's supervisor (providers.local_runner) runs the rank in its image, with this
    host's container settings, and its setup (providers.rank_prep.image_setup) in a first
    container: for the launch file (`launch`: the rank's environment, working folder and user).
    Recorded in `container.json` in the run folder `d`, so that whoever sees the rank end
    removes a container its supervisor could not. `read_only`: host folders the rank reads (the
    node's data cache, which its `data` links point into). Raises ContainerSetupError."""
    rt = Runtime.resolve(env.get(RUNTIME_ENV) or None)
    user = launch["user"]
    store = store_path(env.get("ONEPOOL_CHECKPOINT_URI"))
    if store is not None:
        os.makedirs(store, exist_ok=True)  # (a rank user's own: Isolation.prepare_store)
    image = env[IMAGE_ENV]
    how: dict[str, Any] = {"cwd": launch["cwd"], "job_dir": job_dir, "run_dir": d,
                           "rootless": os.geteuid() != 0, "env_path": d / ENV_FILE, "read_only": read_only,
                           "user": None if user is None else (user[0], user[1])}
    run, env_text = build_run(rt, image, argv, launch["env"], **how)
    cli_env = {**rt.cli_env(), **tags}
    tmp = d / (CONTAINER_FILE + ".tmp")
    tmp.write_text(json.dumps({"cli": rt.cli, "kind": rt.kind, "cli_env": cli_env, "name": container_name(d),
                               "setup": setup is not None}))
    tmp.replace(d / CONTAINER_FILE)
    out = {"cli": rt.cli, "kind": rt.kind, "image": image, "run": run, "image_at": len(run) - len(argv) - 1,
           "env_file": env_text, "cli_env": cli_env}
    if setup is not None:
        inner = setup_argv(setup["commands"])
        out["setup"] = {**setup, "run": build_run(rt, image, inner, launch["env"], setup=True, **how)[0]}
    return out


CONTAINER_FILE = "container.json"  # the rank's container (cli, kind, name): removed by whoever sees it end
ENV_FILE = "container.env"  # the container's environment, private to the broker, gone at the end


def prepare(run_dir: Path, plan: Mapping[str, Any], say: Callable[[str], None]) -> list[str]:
    """In the supervisor, before the container starts: pull its image (timed, recorded in the
    rank's folder, see providers.image_pull) and write its env file (0600). Returns the `run`
    command line. Raises PullFailed."""
    pulled = pull_image(plan["cli"], plan["kind"], plan["image"], plan["cli_env"])
    record(run_dir, pulled)
    say(f"onepool: image {pulled.image} {'found on this node' if pulled.cached else 'pulled'} "
        f"in {pulled.seconds:.2f}s\n")
    path = run_dir / ENV_FILE
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(plan["env_file"])
    run = list(plan["run"])
    if plan.get("setup"):
        run[plan["image_at"]] = run_setup(run_dir, plan, say)
    return run


def run_setup(run_dir: Path, plan: Mapping[str, Any], say: Callable[[str], None],
              clock: Callable[[], float] = time.monotonic) -> str:
    """The job's setup with an image, once per node per (image, code, setup) digest: under an
    exclusive lock (ranks of one node wait for the first), the derived image `setup_image(digest)`
    is used if this node's runtime holds it ("cached"); else the setup runs in a container of
    the job's image with the rank's mounts and environment (plan["setup"]["run"]), and that
    container is committed as the derived image, then removed. What the setup changed in the
    image (packages it installed) is in every later rank of the node; what it wrote into the
    mounted folders (the rank's code copy) is that rank's only, as without an image. Its output
    goes to the rank's log; its time to `setup.json` in the run folder (the `setup` phase).
    Returns the image the rank runs. Raises SetupFailed (the job's failure: a retry runs it again)."""
    s = plan["setup"]
    derived = setup_image(s["digest"])
    env = plan["cli_env"]
    t0 = clock()
    with open(s["lock"], "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lookup = [plan["cli"], "image", "exists" if plan["kind"] == "podman" else "inspect", derived]
        cached = _quiet(lookup, env) == 0
        if cached:
            say(f"onepool setup: cached on this node ({derived})\n")
        else:
            name = container_name(run_dir) + "-setup"
            _quiet([plan["cli"], "rm", "-f", name], env)  # a previous try's, killed before its commit
            try:
                # (deaf to SIGUSR1, "checkpoint now", sent to the rank's group: nothing to save yet)
                r = subprocess.run(s["run"], env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, preexec_fn=deaf_to_usr1)
                say(r.stdout.decode(errors="replace"))
                if r.returncode != 0:
                    say(f"onepool setup: failed (exit {r.returncode})\n")
                    raise SetupFailed(r.returncode if 0 < r.returncode < 256 else 1)
                c = subprocess.run([plan["cli"], "commit", "-q", name, derived], env=dict(env),
                                   stdin=subprocess.DEVNULL, capture_output=True)
                if c.returncode != 0:
                    say(f"onepool setup: cannot keep its result: {c.stderr.decode(errors='replace')}\n")
                    raise SetupFailed(1)
            finally:
                _quiet([plan["cli"], "rm", "-f", name], env)
    took = clock() - t0
    say(f"onepool setup: {'cached' if cached else 'done'} in {took:.2f} s\n")
    tmp = run_dir / "setup.json.tmp"
    tmp.write_text(json.dumps({"setup_s": round(took, 3), "cached": cached, "digest": s["digest"]}))
    tmp.replace(run_dir / "setup.json")
    return derived


def _quiet(argv: list[str], env: Mapping[str, str]) -> int:
    """Run a runtime command for its status only."""
    try:
        return subprocess.run(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=LOOKUP_S).returncode
    except (OSError, subprocess.TimeoutExpired):
        return -1


def remove(run_dir: Path, timeout_s: float = 30.0) -> None:
    """Remove the rank's container if it is still there (its supervisor died before `--rm`
    did), and its env file. Quietly nothing when there is none. A container whose monitor
    (conmon) was killed with the rank may need a second `rm -f` (the first marks it stopped).
    A runtime that still fails or hangs is left to the operator (`podman ps -a --filter
    label=onepool.rank`), never raised."""
    with contextlib.suppress(FileNotFoundError):
        (run_dir / ENV_FILE).unlink()
    try:
        c = json.loads((run_dir / CONTAINER_FILE).read_text())
    except (OSError, ValueError):
        return
    # (no stop grace: its job has ended, or is being killed with the rank)
    argv = [c["cli"], "rm", "-f", *(["--ignore", "--time", "0"] if c["kind"] == "podman" else []),
            c["name"], *([c["name"] + "-setup"] if c.get("setup") else [])]  # (a setup's, if it died in it)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        for _ in range(3):  # a container whose monitor was killed is marked stopped by a first try
            done = subprocess.run(argv, env=c.get("cli_env"), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s)
            if done.returncode == 0:
                break
    with contextlib.suppress(FileNotFoundError):
        (run_dir / CONTAINER_FILE).unlink()
