"""A `provider: slurm` pool in onepool.yaml, and the batch script of an attempt (no cluster
needed: pure validation and rendering)."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from broker.errors import SpecError
from broker.spec import parse_config
from providers.slurm.script import REQUEUED_EXIT, Submission, batch_script


def cfg(**slurm_pool: Any) -> dict[str, Any]:
    pool = {"name": "lab", "provider": "slurm", "gpu_type": "A100", "gpus_per_node": 4, "nodes": 2,
            "slurm": {"partition": "gpu"}, **slurm_pool}
    return {"pools": [pool], "teams": [{"name": "research"}]}


def test_a_minimal_slurm_pool_and_every_option():
    c = parse_config(cfg())
    s = c.pools[0].slurm
    assert s is not None and s.partition == "gpu" and s.login is None and s.gres_type is None
    full = parse_config(cfg(slurm={
        "partition": "gpu", "account": "vision-lab", "qos": "normal", "gres_type": "a100",
        "login": "onepool@login1.cluster", "ssh_options": ["Port=2222", "IdentityFile=/etc/onepool/id"],
        "command_timeout_s": 20, "output_dir": "/shared/onepool", "jobcomp_log": "/var/log/slurm/jobcomp.log",
        "start_timeout_s": 300, "cpus_per_gpu": 8, "mem_per_gpu": "64G", "time_limit": "2-00:00:00"}))
    assert full.pools[0].slurm.account == "vision-lab"  # type: ignore[union-attr]


@pytest.mark.parametrize("over, field, says", [
    ({"slurm": None}, "pools.0", "needs a `slurm:` section naming its partition"),
    ({"slurm": {}}, "pools.0.slurm.partition", "Field required"),
    ({"slurm": {"partition": "gpu; rm -rf /"}}, "pools.0.slurm.partition", "must be a Slurm name: letters"),
    ({"slurm": {"partition": "gpu", "qos": "a b"}}, "pools.0.slurm.qos", "must be a Slurm name"),
    ({"slurm": {"partition": "gpu", "login": "-oProxyCommand=x"}}, "pools.0.slurm.login",
     "must be host or user@host (got '-oProxyCommand=x')"),
    ({"slurm": {"partition": "gpu", "ssh_options": ["-p 22"]}}, "pools.0.slurm.ssh_options",
     "must be an ssh -o setting like Port=2222 (got '-p 22')"),
    ({"slurm": {"partition": "gpu", "mem_per_gpu": "lots"}}, "pools.0.slurm.mem_per_gpu", "a size like 64G"),
    ({"slurm": {"partition": "gpu", "start_timeout_s": 0}}, "pools.0.slurm.start_timeout_s",
     "greater than 0"),
    ({"slurm": {"partition": "gpu", "wat": 1}}, "pools.0.slurm.wat", "unknown field"),
    ({"slurm": {"partition": "gpu", "time_limit": "soon"}}, "pools.0.slurm.time_limit", "a Slurm time like"),
    ({"market": "spot"}, "pools.0", "a slurm pool is onprem"),
    ({"max_nodes": 4}, "pools.0", "a slurm pool does not grow"),
    ({"provider": "local"}, "pools.0", "only a pool with provider slurm has a `slurm:` section"),
])
def test_bad_slurm_pool_names_the_field(over, field, says):
    with pytest.raises(SpecError) as e:
        parse_config(cfg(**over))
    line = next(p for p in e.value.problems if p.startswith(field))
    assert says in line, e.value.problems


def sub(**over: Any) -> Submission:
    base: dict[str, Any] = dict(
        name="onepool-op-1-a7", comment="onepool:broker=op-1,job=3,attempt=7,number=2,pool=lab",
        partition="gpu", nodes=("n01", "n02"), gpus_per_node=4, gres_type="a100",
        argv=("python", "train.py", "--msg", "it's; $HOME"), output_dir="/shared/runs", attempt_id=7,
        env={"ONEPOOL_JOB_ID": "3", "ONEPOOL_RANK": "0", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
             "MY_VAR": "a 'quoted' $value"}, signal_before_s=60)
    return Submission(**{**base, **over})


def sbatch_opts(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_one_allocation_one_rank_per_node_with_the_gres_and_no_requeue():
    script = batch_script(sub())
    opts = sbatch_opts(script)
    assert opts[:10] == [
        "--job-name=onepool-op-1-a7", "--comment=onepool:broker=op-1,job=3,attempt=7,number=2,pool=lab",
        "--partition=gpu", "--nodes=2", "--ntasks-per-node=1", "--nodelist=n01,n02",
        "--gres=gpu:a100:4", "--no-requeue", "--signal=USR1@60",
        "--output=/shared/runs/attempt-7/slurm-%j.out"]
    srun = shlex.split(script.splitlines()[-1])
    assert srun[:6] == ["exec", "srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                        "--kill-on-bad-exit=0"]
    assert srun[-5:] == ["onepool-rank", "python", "train.py", "--msg", "it's; $HOME"]
    assert "--output=/shared/runs/attempt-7/rank-%t/output.log" in srun


def test_environment_is_exported_quoted_without_slurm_owned_variables():
    script = batch_script(sub())
    exports = [line for line in script.splitlines() if line.startswith("export ")]
    assert exports == ["export MY_VAR='a '\"'\"'quoted'\"'\"' $value'", "export ONEPOOL_JOB_ID=3"]
    assert f"exit {REQUEUED_EXIT}" in script  # a rerun after a Slurm requeue does nothing


@pytest.mark.parametrize("over, has", [
    ({"account": "lab", "qos": "high"}, ["--account=lab", "--qos=high"]),
    ({"gres_type": None}, ["--gres=gpu:4"]),
    ({"workdir": "/home/u/proj"}, ["--chdir=/home/u/proj"]),
    ({"cpus_per_gpu": 8, "mem_per_gpu": "64G", "time_limit": "1:00:00"},
     ["--cpus-per-gpu=8", "--mem-per-gpu=64G", "--time=1:00:00"]),
])
def test_optional_settings(over, has):
    opts = sbatch_opts(batch_script(sub(**over)))
    assert all(h in opts for h in has)


def test_bad_submissions_are_refused():
    with pytest.raises(ValueError, match="at least one node"):
        batch_script(sub(nodes=()))
    with pytest.raises(ValueError, match="not a name a shell can export"):
        batch_script(sub(env={"BAD-NAME": "x"}))


def test_the_example_config_with_a_slurm_pool_is_valid():
    from pathlib import Path

    from broker.spec import load_config

    c = load_config(Path(__file__).resolve().parents[2] / "examples" / "onepool-slurm.yaml")
    (pool,) = [p for p in c.pools if p.provider == "slurm"]
    assert pool.slurm is not None and pool.slurm.partition == "onepool" and pool.slurm.gres_type == "a100"
