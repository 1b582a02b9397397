"""The rules of container images without any container (issue 26 part 2): which references a
job may name, which pools may run them, and the `run` command line a rank gets
(providers.container). Real podman runs in tests/containers/."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from broker.errors import SpecError
from broker.spec import check_job_fits, parse_config, parse_job
from providers import start_errors
from providers.container import ContainerSetupError, Runtime, build_run, container_env, gpu_args
from providers.image_pull import NOT_FOUND

GOOD_REFS = ["busybox", "busybox:1.36", "ghcr.io/lab/train:3", "127.0.0.1:5055/bb:1",
             "localhost:5000/a/b/c:v1.2-rc_3", "registry.example.com/x__y/z-w:latest",
             "nvcr.io/nvidia/pytorch:24.05-py3", "ghcr.io/lab/train@sha256:" + "a" * 64,
             "ghcr.io/lab/train:3@sha256:" + "0123456789abcdef" * 4, "[::1]:5000/bb:1"]
BAD_REFS = ["", "Train:3", "lab/Train:3", "ghcr.io/lab/train:", "-rm", "train:3 --privileged", "a/b:c:d",
            "ghcr.io//train", "train@sha256:abc", "a" * 600, "train:" + "t" * 129, "trai n", "x/.y"]


@pytest.mark.parametrize("ref", GOOD_REFS)
def test_an_oci_reference_is_accepted(ref: str) -> None:
    assert parse_job({"name": "j", "team": "t", "command": ["true"], "image": ref}).image == ref


@pytest.mark.parametrize("ref", BAD_REFS)
def test_a_malformed_reference_is_refused_naming_the_field_and_the_form(ref: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_job({"name": "j", "team": "t", "command": ["true"], "image": ref})
    [line] = e.value.problems
    assert line.startswith("image:") and "[REGISTRY[:PORT]/]NAME[:TAG]" in line, line


def pools(**slurm: Any) -> dict[str, Any]:
    return {"pools": [{"name": "hpc", "provider": "slurm", "gpu_type": "A100", "gpus_per_node": 8,
                       "nodes": 4, "slurm": {"partition": "gpu"}, **slurm}],
            "teams": [{"name": "t"}]}


JOB = {"name": "j", "team": "t", "command": ["python", "train.py"], "image": "ghcr.io/lab/train:3"}


@pytest.mark.parametrize(("cfg", "job", "refused"), [
    (pools(), JOB, True),  # a Slurm pool that names no container plug-in
    (pools(container_runtime="pyxis"), JOB, False),
    (pools(container_runtime="apptainer"), JOB, False),
    (pools(), {**JOB, "image": None}, False),  # no image: as before
    ({**pools(), "pools": [*pools()["pools"], {"name": "box", "gpu_type": "A100", "gpus_per_node": 8,
                                              "nodes": 1}]}, JOB, False),  # a local pool fits too
])
def test_an_image_job_is_refused_at_submit_where_only_slurm_without_a_runtime_fits(cfg, job, refused):
    config = parse_config(cfg)
    if not refused:
        check_job_fits(parse_job(job), config)
        return
    with pytest.raises(SpecError) as e:
        check_job_fits(parse_job(job), config)
    assert any(p.startswith("image:") and "container_runtime: pyxis or apptainer" in p
               for p in e.value.problems), e.value.problems


@pytest.mark.parametrize(("pool", "value", "allowed"), [
    ({"provider": "slurm", "slurm": {"partition": "gpu"}}, "podman", "pyxis or apptainer"),
    ({"provider": "slurm", "slurm": {"partition": "gpu"}}, "docker", "pyxis or apptainer"),
    ({}, "pyxis", "podman or docker"),
    ({"provider": "agent"}, "apptainer", "podman or docker"),
    ({}, "containerd", "podman"),
])
def test_a_pools_container_runtime_must_fit_its_provider(pool, value, allowed):
    cfg = {"pools": [{"name": "p", "gpu_type": "A100", "gpus_per_node": 1, "nodes": 1,
                      "container_runtime": value, **pool}], "teams": [{"name": "t"}]}
    with pytest.raises(SpecError) as e:
        parse_config(cfg)
    assert any("container_runtime" in p and allowed in p for p in e.value.problems), e.value.problems


def runtime(tmp: Path, kind: str = "podman", gpus: str = "cdi", extra: tuple[str, ...] = ()) -> Runtime:
    return Runtime(kind, str(tmp / kind), gpus, extra)


def run_of(tmp: Path, rt: Runtime, env: dict[str, str], user: tuple[int, int] | None = None,
           rootless: bool = False) -> tuple[list[str], str]:
    return build_run(rt, "ghcr.io/lab/train:3", ["python", "train.py"], env, cwd="/work/proj",
                     job_dir=tmp / "job", run_dir=tmp / "run", user=user, rootless=rootless,
                     env_path=tmp / "run" / "container.env")


@pytest.mark.parametrize(("kind", "mode", "visible", "flags", "inside"), [
    ("podman", "cdi", "2,3", ["--device", "nvidia.com/gpu=2", "--device", "nvidia.com/gpu=3"], "0,1"),
    ("docker", "gpus", "1,5", ["--gpus", '"device=1,5"'], "0,1"),
    ("podman", "gpus", "0", ["--gpus", '"device=0"'], "0"),
    ("podman", "none", "2,3", [], None),  # a node without GPUs to hand over (this test machine)
    ("podman", "cdi", "", [], None),
])
def test_gpu_slots_reach_the_container_renumbered(tmp_path, kind, mode, visible, flags, inside):
    rt = runtime(tmp_path, kind, mode)
    assert gpu_args(rt, visible) == (flags, inside)
    argv, env_text = run_of(tmp_path, rt, {"CUDA_VISIBLE_DEVICES": visible})
    assert argv[argv.index("ghcr.io/lab/train:3") - len(flags):argv.index("ghcr.io/lab/train:3")] == flags
    assert f"CUDA_VISIBLE_DEVICES={inside if inside is not None else visible}\n" in env_text


def test_the_job_environment_goes_through_a_private_file_never_the_command_line(tmp_path):
    env = {"WANDB_API_KEY": "s3cr3t", "PATH": "/host/venv/bin:/usr/bin", "HOME": str(tmp_path / "job"),
           "ONEPOOL_JOB_ID": "9", "LD_PRELOAD": "/job/evil.so", "CONTAINERS_CONF": "/job/c.conf",
           "ONEPOOL_CHECKPOINT_URI": f"file://{tmp_path}/ck/t/9"}
    argv, env_text = run_of(tmp_path, runtime(tmp_path), env)
    assert not any("s3cr3t" in a or "evil" in a for a in argv)
    assert "WANDB_API_KEY=s3cr3t\n" in env_text and "ONEPOOL_JOB_ID=9\n" in env_text
    assert "PATH=/host" not in env_text  # the image's own PATH finds its interpreter
    assert "PYTHONPATH=/opt/onepool/lib\n" in env_text
    volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "--volume"]
    assert volumes[:3] == [f"{tmp_path / 'job'}:{tmp_path / 'job'}:rw", "/work/proj:/work/proj:rw",
                           f"{tmp_path}/ck/t/9:{tmp_path}/ck/t/9:rw"]
    assert volumes[3].endswith(":/opt/onepool/lib/broker:ro") and len(volumes) == 4
    # the runtime's own process gets the host's variables only (a job's LD_PRELOAD or
    # CONTAINERS_CONF would take over a root podman)
    cli_env = runtime(tmp_path).cli_env({"HOME": "/root", "LD_PRELOAD": "x", "XDG_RUNTIME_DIR": "/run/u"})
    assert set(cli_env) == {"PATH", "LANG", "HOME", "XDG_RUNTIME_DIR"}


@pytest.mark.parametrize(("user", "rootless", "kind", "expect", "absent"), [
    ((65534, 65534), False, "podman", ["--user", "65534:65534"], "--userns=keep-id"),
    (None, True, "podman", ["--userns=keep-id"], "--user"),
    (None, True, "docker", [], "--userns=keep-id"),
    (None, False, "podman", [], "--user"),
])
def test_the_rank_runs_as_its_user(tmp_path, user, rootless, kind, expect, absent):
    argv, _ = run_of(tmp_path, runtime(tmp_path, kind), {}, user=user, rootless=rootless)
    assert absent not in argv
    if expect:
        i = argv.index(expect[0])
        assert argv[i:i + len(expect)] == expect
    for flag in ("--rm", "--init", "--sig-proxy=true", "--pull=never"):
        assert flag in argv


def test_a_value_with_a_line_break_is_refused_with_its_name(tmp_path):
    with pytest.raises(ContainerSetupError) as e:
        run_of(tmp_path, runtime(tmp_path), {"NOTE": "a\nb"})
    assert e.value.kind == "invalid_command" and "'NOTE'" in str(e.value)


def executable(path: Path) -> str:
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(("named", "on_path", "settings", "kind", "error"), [
    (None, ["podman", "docker"], {}, "podman", None),
    (None, ["docker"], {}, "docker", None),
    ("docker", ["podman", "docker"], {}, "docker", None),
    (None, [], {}, None, "no container runtime (podman or docker)"),
    ("docker", ["podman"], {}, None, "no container runtime (docker)"),
    ("pyxis", ["podman"], {}, None, "must be one of podman, docker"),
    (None, ["podman"], {"ONEPOOL_CONTAINER_GPUS": "all"}, None, "ONEPOOL_CONTAINER_GPUS: must be one of"),
    (None, ["podman"], {"ONEPOOL_CONTAINER_ARGS": "--x 'open"}, None, "ONEPOOL_CONTAINER_ARGS"),
    (None, [], {"ONEPOOL_CONTAINER_CLI": "/no/such/podman"}, None, "is not an executable"),
])
def test_the_node_runtime_is_found_or_the_start_fails_on_this_node(tmp_path, named, on_path, settings,
                                                                     kind, error):
    for name in on_path:
        executable(tmp_path / name)
    host = {"PATH": str(tmp_path), **settings}
    if error is None:
        rt = Runtime.resolve(named, host)
        assert (rt.kind, rt.cli) == (kind, os.path.join(tmp_path, kind))
        assert rt.gpus == ("cdi" if kind == "podman" else "gpus")
        return
    with pytest.raises(ContainerSetupError) as e:
        Runtime.resolve(named, host)
    assert error in str(e.value) and not start_errors.job_at_fault(start_errors.cause(e.value.kind))


def test_an_image_the_registry_lacks_is_the_jobs_fault_an_unreachable_one_maybe_the_nodes():
    assert start_errors.job_at_fault("start_failed:image_not_found")
    assert not start_errors.job_at_fault("start_failed:image_pull_failed")
    assert not start_errors.job_at_fault("start_failed:container_failed")
    assert "manifest unknown" in NOT_FOUND


def test_the_broker_names_the_image_and_the_pools_runtime_only_for_image_jobs():
    assert container_env(None, "podman") == {}
    assert container_env("bb:1", None) == {"ONEPOOL_IMAGE": "bb:1"}
    assert container_env("bb:1", "docker") == {"ONEPOOL_IMAGE": "bb:1", "ONEPOOL_CONTAINER_RUNTIME": "docker"}


@pytest.mark.parametrize(("runtime", "workdir", "srun", "argv"), [
    ("pyxis", "/shared/proj", ("--container-image=ghcr.io/lab/train:3",
                               "--container-mounts=/shared/proj:/shared/proj",
                               "--container-workdir=/shared/proj"), ("python", "train.py")),
    ("pyxis", None, ("--container-image=ghcr.io/lab/train:3",), ("python", "train.py")),
    ("apptainer", "/shared/proj", (), ("apptainer", "exec", "--nv", "docker://ghcr.io/lab/train:3",
                                       "python", "train.py")),
])
def test_a_slurm_pools_plugin_runs_the_rank_in_the_image(runtime, workdir, srun, argv):
    """The sbatch script only: no plug-in on the Slurm test cluster (see the README)."""
    from providers.slurm.script import Submission, batch_script, in_container

    got = in_container(runtime, "ghcr.io/lab/train:3", ("python", "train.py"), workdir)
    assert got == (srun, argv)
    script = batch_script(Submission(name="n", comment="c", partition="gpu", nodes=("n1",), gpus_per_node=1,
                                     gres_type=None, argv=got[1], env={}, output_dir="/o", attempt_id=1,
                                     srun_extra=got[0]))
    srun_line = script.splitlines()[-1]
    assert all(o in srun_line for o in srun) and srun_line.index("--open-mode") < srun_line.index("bash")
    with pytest.raises(ValueError, match="pyxis or apptainer"):
        in_container("podman", "x:1", (), None)


def test_the_container_example_is_a_valid_job() -> None:
    import yaml

    spec = parse_job(yaml.safe_load((Path(__file__).parent.parent / "examples" / "container" / "job.yaml")
                                    .read_text()))
    assert spec.image == "registry.example.com/lab/train-numpy:1" and "/app/train_numpy.py" in spec.command


def test_the_code_and_setup_example_is_a_valid_job_shipping_the_examples_folder() -> None:
    import yaml

    from broker.spec_code import relative_to_file

    path = Path(__file__).parent.parent / "examples" / "code-setup" / "job.yaml"
    data = yaml.safe_load(path.read_text())
    folder = Path(str(relative_to_file(data["code"], path)))
    spec = parse_job({**data, "code": str(folder)})
    assert folder == path.parent.parent and (folder / spec.command[1]).is_file()
    assert spec.setup and all((folder / w).is_file() for c in spec.setup for w in c.split() if "/" in w)
