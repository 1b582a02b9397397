"""A small numpy model that trains, checkpoints every few seconds, and survives preemption.

Linear regression by mini-batch SGD on a fixed synthetic problem. Each step does a little
real numpy work, then waits `--step-s` to stand in for a GPU step. It resumes from the
broker's checkpoint (continuing its step counter), saves every `--ckpt-every` steps (in the
background; 0: whenever `runtime.due()` says the broker's interval passed), saves at once
when the broker asks for a checkpoint (SIGUSR1), and on SIGTERM
saves and exits for requeue. `--state-kb` adds an optimizer-state file of that size to each
checkpoint (for realistic copy and egress numbers). On success it appends one line to
`--done-file` (if given), so tests can count completions.

    python examples/train_numpy.py --steps 40 --step-s 0.25 --ckpt-every 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from broker import runtime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-s", type=float, default=0.25)
    ap.add_argument("--ckpt-every", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--done-file", default=None)
    ap.add_argument("--state-kb", type=int, default=0)
    args = ap.parse_args()
    runtime.install()

    rng = np.random.default_rng(0)
    true_w = rng.normal(size=args.dim)
    ck = runtime.restore()
    if ck is not None:
        w, step = ck.arrays["w"], ck.step + 1
        print(f"resumed from step {ck.step} (attempt {runtime.context().attempt})", flush=True)
    else:
        w, step = np.zeros(args.dim), 0
        print("fresh start", flush=True)
    print(f"checkpoint interval {runtime.context().checkpoint_interval_s:g} s", flush=True)

    state = np.random.default_rng(1).bytes(args.state_kb * 1024)
    while step < args.steps:
        batch = np.random.default_rng(step).normal(size=(256, args.dim))
        grad = batch.T @ (batch @ w - batch @ true_w) / len(batch)
        w = w - 0.05 * grad
        time.sleep(args.step_s)
        runtime.progress(step, args.steps)
        stop = runtime.preempted()  # read once: a SIGTERM right after still gets its save
        periodic = runtime.due() if args.ckpt_every <= 0 else (step + 1) % args.ckpt_every == 0
        if stop or runtime.checkpoint_requested() or periodic:
            runtime.save(step, arrays={"w": w}, files={"optimizer.bin": state} if state else None)
        if stop:
            print(f"preempted: saved step {step}, exiting for requeue", flush=True)
            runtime.exit_preempted()
        step += 1

    runtime.wait()
    loss = float(np.mean((w - true_w) ** 2))
    print(f"done: {args.steps} steps, loss {loss:.3g}", flush=True)
    if args.done_file:
        with open(args.done_file, "a") as f:
            f.write(json.dumps({"job": os.environ.get("ONEPOOL_JOB_ID"), "rank": runtime.context().rank,
                                "attempt": runtime.context().attempt, "loss": loss}) + "\n")
    runtime.done()  # the broker will not run it again, even if its supervisor dies now
    return 0


if __name__ == "__main__":
    sys.exit(main())
