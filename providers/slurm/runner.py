"""One small way to run Slurm's commands: on this machine, or on a login node over SSH.

Every command goes through `Runner.run(argv, stdin=None)` with a timeout. Errors say what to
do (see providers.base):
- SlurmUnreachable (Transient): the command could not run or Slurm did not answer (ssh
  failed, the command is missing, a timeout, "Unable to contact slurm controller"); retry
  later. Nothing is known about the outcome of a command that timed out.
- SlurmRejected (Fatal): Slurm answered no (a bad partition, account or QOS, a request
  the partition cannot hold); retrying the same request cannot help.

SSH uses the system's `ssh` client (so ~/.ssh/config, agents, keys and known_hosts work as
for any admin), in batch mode (never a password prompt), with a shared control connection
so a command costs one round trip, not a handshake.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Protocol

from providers.base import Fatal, Transient

# What Slurm's commands print when the controller is down or unreachable (retry later).
_UNREACHABLE = ("unable to contact slurm controller", "connection refused", "socket timed out",
                "connection timed out", "communication connection failure",
                "zero bytes were transmitted", "unable to establish")


class SlurmUnreachable(Transient):
    """Slurm's commands could not be run or the controller did not answer: retry later."""


class SlurmRejected(Fatal):
    """Slurm refused the request (its message says why): fix the pool's settings."""


class Runner(Protocol):
    where: str  # "this machine" or "user@login-node", for messages

    def run(self, argv: list[str], stdin: str | None = None, ok_codes: tuple[int, ...] = (0,)) -> str:
        """Run argv, return its stdout (an exit code in `ok_codes` is success). Raises
        SlurmUnreachable or SlurmRejected."""
        ...


class LocalRunner:
    """Runs the commands on the broker's machine."""

    where = "this machine"

    def __init__(self, timeout_s: float = 30.0, env: dict[str, str] | None = None) -> None:
        self.timeout_s = timeout_s
        self.env = env

    def run(self, argv: list[str], stdin: str | None = None, ok_codes: tuple[int, ...] = (0,)) -> str:
        return _run(argv, argv, stdin, self.timeout_s, self.where, self.env, ok_codes)


class SshRunner:
    """Runs the commands on `login` ("host" or "user@host") through `ssh`. `options` are
    ssh -o settings ("Port=2222", "IdentityFile=/etc/onepool/id_ed25519", ...)."""

    def __init__(self, login: str, options: list[str] | tuple[str, ...] = (),
                 timeout_s: float = 30.0) -> None:
        self.login, self.where, self.timeout_s = login, login, timeout_s
        control = Path(tempfile.gettempdir()) / f"onepool-ssh-{os.getuid()}"
        control.mkdir(mode=0o700, exist_ok=True)
        self.base = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout_s))}",
                     "-o", "ControlMaster=auto", "-o", f"ControlPath={control}/%C",
                     "-o", "ControlPersist=300", "-o", "ServerAliveInterval=15"]
        for opt in options:
            self.base += ["-o", opt]

    def close(self) -> None:
        """End the shared connection (it would otherwise linger ControlPersist seconds)."""
        subprocess.run([*self.base, "-O", "exit", self.login], capture_output=True, timeout=self.timeout_s,
                       stdin=subprocess.DEVNULL)

    def run(self, argv: list[str], stdin: str | None = None, ok_codes: tuple[int, ...] = (0,)) -> str:
        remote = " ".join(shlex.quote(a) for a in argv)
        return _run([*self.base, self.login, "--", remote], argv, stdin, self.timeout_s, self.where,
                    None, ok_codes)


def _run(cmd: list[str], argv: list[str], stdin: str | None, timeout_s: float, where: str,
         env: dict[str, str] | None, ok_codes: tuple[int, ...] = (0,)) -> str:
    shown = " ".join(shlex.quote(a) for a in argv)
    try:
        p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout_s,
                           env=env, stdin=None if stdin is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmUnreachable(f"`{cmd[0]}` is not installed on {where} (needed for `{shown}`)") from None
    except subprocess.TimeoutExpired:
        raise SlurmUnreachable(f"`{shown}` on {where} did not answer in {timeout_s:g}s") from None
    if p.returncode in ok_codes:
        return p.stdout
    err = (p.stderr or p.stdout).strip()
    low = err.lower()
    if cmd[0] == "ssh" and p.returncode == 255:
        raise SlurmUnreachable(f"ssh to {where} failed: {err or 'exit 255'}")
    if p.returncode == 127 or "command not found" in low:
        raise SlurmUnreachable(f"`{argv[0]}` is not installed on {where}: {err}")
    if any(k in low for k in _UNREACHABLE):
        raise SlurmUnreachable(f"`{shown}` on {where}: Slurm did not answer: {err}")
    raise SlurmRejected(f"`{shown}` on {where} failed (exit {p.returncode}): {err}")
