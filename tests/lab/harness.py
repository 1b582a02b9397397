"""A lab of separate machines on this one: every host (the server, GPU boxes, a laptop, the
object store) has its own network namespace, joined to the others by one bridge, AND its own
mount and UTS namespaces (its own hostname; private tmpfs over /home, /tmp and /srv; its own
/etc/hosts naming the others), so nothing passes between hosts except over the network
(../shared/notes/multi-host-netns.md has the measured recipe).

    lab = Lab.start(["server", "box0", "box1", "laptop", "objstore"], logs=tmp)
    lab.host("box0").run(["ls", "/srv"])          # a command on that host, waited for
    lab.host("server").spawn([...], name="server")  # a daemon there (killed at close)
    lab.close()                                      # kills every process of every host,
                                                     # deletes the namespaces and links

Each host is one holder process (`sleep infinity`) that made the namespaces; commands join
them with nsenter, so a host's files persist across commands and vanish with the lab. The
project's checkout, /usr and the Python installs stay visible (the "installed software");
everything a host writes goes to its private folders. Names get a random suffix per lab and
addresses are 10.231.N.0/24 only. Where namespaces cannot be made (not root, no
CAP_SYS_ADMIN / CAP_NET_ADMIN, no nsenter), `Lab.start` skips the test and says why.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.agents.harness import wait_for

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PRIVATE = ("/home", "/tmp", "/srv")  # tmpfs of each host's own
Argv = Sequence[str]


class LabCommandFailed(AssertionError):
    """A host command exited non-zero: its argv, exit status and output are in the message."""


@dataclass
class Host:
    """One machine of the lab: `run` (waited for), `spawn` (a daemon), files (`write`, `read`,
    `exists`). Every command starts with a clean environment: `env` (the host's own) plus
    what the call adds; PATH defaults to BASE_PATH."""

    lab: Lab
    name: str
    ip: str
    holder: subprocess.Popen[bytes]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "/"

    def argv(self, argv: Argv, env: Mapping[str, str] | None = None, cwd: str | None = None) -> list[str]:
        """The full command line that runs `argv` inside this host."""
        full = {"PATH": BASE_PATH, "LANG": "C.UTF-8", "HOSTNAME": self.name, **self.env, **(env or {})}
        return ["nsenter", "-t", str(self.holder.pid), "-m", "-n", "-u", "--",
                "env", "-i", "-C", cwd or self.cwd, *(f"{k}={v}" for k, v in full.items()), *argv]

    def run(self, argv: Argv, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            check: bool = True, timeout: float = 60.0, input: bytes | str | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run `argv` here and wait; raises LabCommandFailed (with its output) when `check` and
        it exits non-zero."""
        data = input.encode() if isinstance(input, str) else input
        r = subprocess.run(self.argv(argv, env, cwd), input=data, capture_output=True, timeout=timeout)
        out = subprocess.CompletedProcess(list(argv), r.returncode, r.stdout.decode(errors="replace"),
                                          r.stderr.decode(errors="replace"))
        if check and r.returncode != 0:
            raise LabCommandFailed(f"on {self.name}: {shlex.join(argv)} exited {r.returncode}\n"
                                   f"stdout: {out.stdout[-3000:]}\nstderr: {out.stderr[-3000:]}")
        return out

    def onepool(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """`onepool ARGS` as installed on this host (its PATH), e.g.
        `lab.host("laptop").onepool("submit", "--name", "x", "--", "python", "t.py")`."""
        return self.run(["onepool", *args], **kw)  # type: ignore[arg-type]

    def sh(self, script: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """A bash script here (a README line as a user would type it)."""
        return self.run(["bash", "-c", script], **kw)  # type: ignore[arg-type]

    def spawn(self, argv: Argv, *, name: str, env: Mapping[str, str] | None = None,
              cwd: str | None = None) -> subprocess.Popen[bytes]:
        """Start a daemon here; its output goes to `<lab logs>/<host>-<name>.log` (the test's
        view of its console). Killed, with its process group, at `lab.close()`."""
        log = self.lab.logs / f"{self.name}-{name}.log"
        with open(log, "ab") as f:
            p = subprocess.Popen(self.argv(argv, env, cwd), stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        self.lab.daemons.append(p)
        return p

    def write(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        """Write a file on this host (its folders are created), as if copied there."""
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1"' + (f' && chmod {mode:o} "$1"' if mode else "")
        self.run(["sh", "-c", script, "sh", path], input=data, cwd="/")

    def read(self, path: str) -> str:
        return self.run(["cat", path], cwd="/").stdout

    def exists(self, path: str) -> bool:
        return self.run(["test", "-e", path], check=False, cwd="/").returncode == 0

    def ls(self, path: str) -> list[str]:
        r = self.run(["ls", "-1", path], check=False, cwd="/")
        return r.stdout.split() if r.returncode == 0 else []


@dataclass
class Lab:
    """The hosts, the bridge that joins them (`gateway`: this machine's address on it) and
    everything to undo at `close()`."""

    suffix: str
    net: int
    logs: Path
    hosts: dict[str, Host] = field(default_factory=dict)
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    @property
    def gateway(self) -> str:
        return f"10.231.{self.net}.1"

    @property
    def bridge(self) -> str:
        return f"oplb{self.suffix}"

    def host(self, name: str) -> Host:
        return self.hosts[name]

    @classmethod
    def start(cls, names: Iterable[str], logs: Path) -> Lab:
        """Make the bridge, then one host per name (addresses .10, .11, ... in name order, and
        an /etc/hosts on each naming them all). Skips the test where namespaces are not
        available; on any other failure undoes what it made and raises."""
        missing = [t for t in ("ip", "nsenter", "unshare") if shutil.which(t) is None]
        if missing or os.geteuid() != 0:
            pytest.skip(f"the lab needs root and {', '.join(('ip', 'nsenter', 'unshare'))} "
                        f"(missing: {', '.join(missing) or 'root'}): network and mount namespaces "
                        "cannot be made here")
        suffix = secrets.token_hex(3)
        lab = cls(suffix, 10 + int(suffix[:2], 16) % 200, logs)
        logs.mkdir(parents=True, exist_ok=True)
        names = list(names)
        ips = {n: f"10.231.{lab.net}.{10 + i}" for i, n in enumerate(names)}
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{ip} {n}\n" for n, ip in ips.items())
        try:
            lab._ip_or_skip(["link", "add", lab.bridge, "type", "bridge"])
            lab.links.append(lab.bridge)
            lab._ip(["addr", "add", f"{lab.gateway}/24", "dev", lab.bridge])
            lab._ip(["link", "set", lab.bridge, "up"])
            for i, n in enumerate(names):
                lab.hosts[n] = lab._make_host(n, i, ips[n], hosts_file)
        except BaseException:
            lab.close()
            raise
        return lab

    def _ip(self, args: list[str]) -> None:
        r = subprocess.run(["ip", *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def _ip_or_skip(self, args: list[str]) -> None:
        r = subprocess.run(["ip", *args], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"network namespaces are not available here (ip {' '.join(args)}: "
                        f"{r.stderr.strip()})")

    def _make_host(self, name: str, i: int, ip: str, hosts_file: str) -> Host:
        ns, outer, inner = f"opl{self.suffix}{name}"[:30], f"olo{self.suffix}{i}", f"oli{self.suffix}{i}"
        self._ip(["netns", "add", ns])
        self.namespaces.append(ns)
        self._ip(["link", "add", outer, "type", "veth", "peer", "name", inner])
        self.links.append(outer)
        self._ip(["link", "set", outer, "master", self.bridge])
        self._ip(["link", "set", outer, "up"])
        self._ip(["link", "set", inner, "netns", ns])
        self._ip(["-n", ns, "addr", "add", f"{ip}/24", "dev", inner])
        self._ip(["-n", ns, "link", "set", inner, "up"])
        self._ip(["-n", ns, "link", "set", "lo", "up"])
        mounts = " && ".join(_host_mounts())
        script = (f"set -e; {mounts}; hostname {shlex.quote(name)}; "
                  f"printf %s {shlex.quote(hosts_file)} > /tmp/.lab-hosts; "
                  "mount --bind /tmp/.lab-hosts /etc/hosts; echo ready; exec sleep infinity")
        holder = subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--mount", "--uts",
                                   "--propagation", "private", "sh", "-c", script],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
        self.daemons.append(holder)
        assert holder.stdout is not None
        line = holder.stdout.readline()  # "ready" once the mounts are made, EOF if it failed
        if line.strip() != b"ready":
            err = holder.stderr.read().decode(errors="replace") if holder.stderr else ""
            holder.kill()
            pytest.skip(f"mount namespaces are not available here (host {name}: {err.strip()})")
        return Host(self, name, ip, holder)

    def pids(self) -> list[int]:
        """Every process living in one of the lab's network namespaces."""
        out: list[int] = []
        for ns in self.namespaces:
            r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            out += [int(p) for p in r.stdout.split() if p.isdigit()]
        return out

    def close(self) -> None:
        """Kill every process the lab made (its daemons' groups, then anything left in its
        namespaces: ranks run in sessions of their own), then delete its namespaces and links."""
        for p in self.daemons:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in self.daemons:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        for _ in range(3):
            left = self.pids()
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)  # SIGKILL is delivered asynchronously; look once more
        for p in self.daemons:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        for link in reversed(self.links):
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.daemons.clear()
        self.links.clear()
        self.namespaces.clear()


def wait_until(what: str, cond: object, timeout: float = 30.0, step: float = 0.1) -> object:
    """Poll `cond()` (another machine's state: nothing to await) until truthy, bounded."""
    assert callable(cond)
    return wait_for(what, cond, timeout, step)


__all__ = ["BASE_PATH", "Host", "Lab", "LabCommandFailed", "wait_until"]


def _host_mounts() -> list[str]:
    """The mount commands that make a host: a private tmpfs over each of PRIVATE, and this
    checkout, its virtualenv and its Python kept visible (and runnable by every user, as on a
    real box whose Python lives in /usr or /opt) wherever they are on this machine:

    - under a PRIVATE folder (a checkout in /tmp, as a CI clone may be): the fresh tmpfs would
      hide them;
    - under a folder only root can enter (pyenv under /root, a 0700 mktemp folder): ranks that
      run as `nobody` could not start `python`. That folder gets a 0755 tmpfs.

    Each such tree is bound aside (on a tmpfs over /mnt, private to the host), the folders are
    covered, and the tree is bound back at its own path, whose new parents are 0755; nothing
    else of the covered folders is visible."""
    from tests.lab.builders import REPO

    trees: list[Path] = []
    for t in sorted({REPO.resolve(), Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}):
        if not any(t.is_relative_to(k) for k in trees):
            trees.append(t)
    private = [Path(d) for d in PRIVATE]
    cover: list[Path] = []  # closed folders outside PRIVATE
    keep: list[Path] = []
    for t in trees:
        closed = next((p for p in reversed(t.parents) if p != Path("/") and not p.stat().st_mode & 0o001),
                      None)
        if any(t.is_relative_to(d) for d in private):
            keep.append(t)
        elif closed is not None:
            keep.append(t)
            if closed not in cover:
                cover.append(closed)
    q = shlex.quote
    cmds = ["mount -t tmpfs tmpfs /mnt"] if keep else []
    for i, t in enumerate(keep):
        cmds += [f"mkdir -p /mnt/keep{i}", f"mount --bind {q(str(t))} /mnt/keep{i}"]
    cmds += [f"mount -t tmpfs -o mode={'1777' if d == '/tmp' else '755'} tmpfs {d}" for d in PRIVATE]
    cmds += [f"mount -t tmpfs -o mode=755 tmpfs {q(str(c))}" for c in cover]
    for i, t in enumerate(keep):
        cmds += [f"mkdir -p {q(str(t))}", f"mount --bind /mnt/keep{i} {q(str(t))}", f"umount /mnt/keep{i}"]
    if keep:
        cmds.append("umount /mnt")
    return cmds
