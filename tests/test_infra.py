"""infra/ is true to the code: the example onepool.yaml is valid (and is the README's), the
systemd units call flags the CLI has, the Terraform is formatted and (AWS) valid, and the
broker's IAM policy allows every call the AWS provider makes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

from broker.spec import load_config, parse_config
from providers.base import Fatal
from providers.options import AwsOptions
from providers.registry import make_provider
from tests.conftest import ROOT
from tests.providers.harness import request

INFRA = ROOT / "infra"
TERRAFORM = shutil.which("terraform")
# A local mirror of provider plugins (`terraform init -plugin-dir`): the registry may be unreachable.
PLUGINS = [Path(p) for p in (os.environ.get("ONEPOOL_TF_PLUGIN_DIR"), "/opt/tf-plugins")
           if p and Path(p).is_dir()]


def test_the_example_onepool_yaml_is_valid_and_is_the_readmes() -> None:
    cfg = load_config(INFRA / "onepool.yaml")
    assert {p.provider for p in cfg.pools} == {"agent", "aws", "gcp", "libcloud"}
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    assert (INFRA / "onepool.yaml").read_text() in blocks, "the README shows infra/onepool.yaml verbatim"
    for block in blocks:  # every onepool.yaml the README shows is valid
        data = __import__("yaml").safe_load(block)
        if isinstance(data, dict) and "pools" in data:
            parse_config({"teams": [{"name": "t"}], "broker": {"server_url": "http://10.0.0.5:8421"}, **data})


def test_the_examples_rented_pools_build_or_say_what_is_missing(aws_mock: str) -> None:
    """Built as the broker builds them; the secrets the example names are not on this machine."""
    pools = {p.name: p for p in load_config(INFRA / "onepool.yaml").pools if p.rented}
    aws = make_provider(pools["aws-a100-spot"])
    assert aws.opts.subnet_ids and aws.opts.instance_profile == "onepool-node"  # type: ignore[attr-defined]
    with pytest.raises(Fatal, match=r"cannot use the service-account key /etc/onepool/gcp-broker\.json"):
        make_provider(pools["gcp-t4-spot"])
    with pytest.raises(Fatal, match="environment variable AZURE_CLIENT_ID is not set"):
        make_provider(pools["azure-a100"])


def _help(command: str) -> str:
    """`onepool COMMAND --help`, as the CLI prints it."""
    from typer.testing import CliRunner

    from broker.client.cli import app

    out = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    return out.output


@pytest.mark.parametrize(("unit", "command", "env_file"), [
    ("onepool-server.service", "server", "server.env.example"),
    ("onepool-agent.service", "agent", "agent.env.example"),
])
def test_the_systemd_units_call_flags_the_cli_has(unit: str, command: str, env_file: str,
                                                  tmp_path: Path) -> None:
    text = (INFRA / "systemd" / unit).read_text()
    [exec_start] = re.findall(r"^ExecStart=(.*)$", text, re.M)
    argv = exec_start.split()
    assert argv[0].endswith("/bin/onepool") and argv[1] == command
    helptext = _help(command)
    for flag in [a for a in argv[2:] if a.startswith("--")]:
        assert flag in helptext, f"{unit}: `onepool {command}` has no {flag}"
    assert "KillMode=process" in text  # a restart does not kill the jobs it would adopt
    # a process that exits non-zero (an agent that cannot go on: exit 3 or 4) is started again
    assert re.search(r"^Restart=(always|on-failure)$", text, re.M), f"{unit}: no Restart="
    names = re.findall(r"^([A-Z_]+)=", (INFRA / "systemd" / env_file).read_text(), re.M)
    for name in [n for n in names if n.startswith("ONEPOOL_") and n != "ONEPOOL_DATABASE_URL"]:
        flat = " ".join(helptext.split())  # the help wraps where the terminal's width says
        assert f"env var: {name}" in flat, f"{env_file}: `onepool {command}` does not read {name}"
    if shutil.which("systemd-analyze"):
        copy = tmp_path / unit
        here = str(Path(sys.executable).parent / "onepool")
        copy.write_text(text.replace("/srv/onepool/.venv/bin/onepool", here))
        out = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        assert "Unknown" not in out.stderr and "ignoring" not in out.stderr, out.stderr


def _terraform(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    assert TERRAFORM is not None
    env = {**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}
    return subprocess.run([TERRAFORM, *args, "-no-color"], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.skipif(TERRAFORM is None, reason="terraform is not installed here (infra/README.md)")
@pytest.mark.parametrize("stack", ["aws", "gcp"])
def test_terraform_is_formatted(stack: str) -> None:
    out = _terraform("fmt", "-check", "-diff", "-recursive", cwd=INFRA / stack)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(TERRAFORM is None, reason="terraform is not installed here (infra/README.md)")
def test_terraform_validates_the_aws_stack(tmp_path: Path) -> None:
    work = tmp_path / "aws"
    shutil.copytree(INFRA / "aws", work)
    init = ["init", "-backend=false", "-input=false"] + [f"-plugin-dir={p}" for p in PLUGINS]
    out = _terraform(*init, cwd=work)
    if out.returncode != 0 and "registry.terraform.io" in out.stderr and not PLUGINS:
        pytest.skip("the AWS provider plugin cannot be fetched (no registry, no plugin mirror): "
                    "set ONEPOOL_TF_PLUGIN_DIR to a mirror")
    assert out.returncode == 0, out.stderr
    out = _terraform("validate", "-json", cwd=work)
    result = json.loads(out.stdout)
    assert result["valid"] is True, result["diagnostics"]


def _policy_actions() -> set[str]:
    text = (INFRA / "aws" / "broker.tf").read_text()
    return set(re.findall(r'"((?:ec2|ssm|sqs|iam|pricing|s3):[A-Za-z]+)"', text))


def test_the_brokers_iam_policy_allows_every_call_the_aws_provider_makes(aws_mock: str) -> None:
    session = boto3.session.Session()
    calls: set[str] = set()

    def record(event_name: str, **_: Any) -> None:  # before-call.SERVICE.Operation
        _, service, op = event_name.split(".")
        calls.add(f"{service}:{op}")

    session.events.register("before-call", record)
    ec2 = boto3.client("ec2", region_name=aws_mock)
    ami = ec2.register_image(Name="dlami", RootDeviceName="/dev/sda1")["ImageId"]
    ssm = boto3.client("ssm", region_name=aws_mock)
    ssm.put_parameter(Name="/onepool/ami", Value=ami, Type="String", DataType="aws:ec2:image")
    queue = boto3.client("sqs", region_name=aws_mock).create_queue(QueueName="onepool-notices")["QueueUrl"]
    boto3.client("sqs", region_name=aws_mock).send_message(QueueUrl=queue, MessageBody="{}")
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    from providers.aws import AwsProvider

    opts = AwsOptions(queue_url=queue, subnet_ids=[subnet], root_volume_gb=100)
    p = AwsProvider(aws_mock, session=session, options=opts, image="resolve:ssm:/onepool/ami",
                    instance_types=["g5.xlarge"])
    inst = p.launch(request())
    p.poll("op-test")
    p.interruptions()
    p.offers()
    p.terminate(inst.instance_id)
    assert {"ec2:RunInstances", "ec2:DescribeSpotPriceHistory", "ssm:GetParameter", "sqs:ReceiveMessage",
            "sqs:DeleteMessage", "ec2:DescribeImages"} <= calls  # the recording saw the whole life
    assert calls - _policy_actions() == set(), "infra/aws/broker.tf must allow these"
