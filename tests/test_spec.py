"""Table-driven tests of the validated user input: onepool.yaml and job specs.

Every bad field must yield a SpecError whose problem line names the field path and what is
allowed (the values, the bound, or the rule), so the user can fix it without reading code.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.errors import SpecError
from broker.spec import (
    ClusterConfig,
    JobSpec,
    Market,
    Priority,
    SpotPolicy,
    check_job_fits,
    load_config,
    market_ok,
    parse_config,
    parse_job,
)

NAME_RULE = "lowercase letters, digits"


# -- builders ---------------------------------------------------------------------------------
def _pool(**over: Any) -> dict[str, Any]:
    return {"name": "a100", "gpu_type": "A100", "gpus_per_node": 8, "nodes": 2, **over}


def cfg(*, pool: dict[str, Any] | None = None, team: dict[str, Any] | None = None,
        pools: list[dict[str, Any]] | None = None, **over: Any) -> dict[str, Any]:
    """A valid config dict. `pool=`/`team=` override fields of the first pool/team,
    `pools=` replaces the pool list, other keywords replace top-level keys."""
    data: dict[str, Any] = {
        "pools": pools if pools is not None else [_pool(**(pool or {}))],
        "teams": [{"name": "research", **(team or {})}, {"name": "prod"}],
        "broker": {"cycle_s": 1.0},
    }
    data.update(over)
    return data


def jobd(**over: Any) -> dict[str, Any]:
    """A valid job dict with overrides."""
    return {"name": "bert", "team": "research", "command": ["python", "train.py"], **over}


def problems_of(exc: pytest.ExceptionInfo[SpecError]) -> str:
    return "\n".join(exc.value.problems)


def without(d: dict[str, Any], *path: str | int) -> dict[str, Any]:
    """A deep copy of `d` with the key at `path` removed."""
    out = copy.deepcopy(d)
    node: Any = out
    for k in path[:-1]:
        node = node[k]
    del node[path[-1]]
    return out


# -- bad config fields ------------------------------------------------------------------------
BAD_CONFIGS = [
    # quotas (issue 28): each bad value names its field and what is allowed
    pytest.param(cfg(team={"quota": {"gpus": -1}}), "teams.0.quota.gpus", ["0 or more", "-1"],
                 id="quota-negative"),
    pytest.param(cfg(team={"quota": {"gpus": {"A100": -2}}}), "teams.0.quota.gpus",
                 ["0 or more", "'A100'"], id="quota-type-negative"),
    pytest.param(cfg(team={"quota": {"gpus": {}}}), "teams.0.quota.gpus",
                 ["mapping of GPU type"], id="quota-empty-mapping"),
    pytest.param(cfg(team={"quota": {"gpus": "lots"}}), "teams.0.quota.gpus",
                 ["integer"], id="quota-not-a-number"),
    pytest.param(cfg(team={"quota": {"gpus": 8, "borrowing_limit": -1}}),
                 "teams.0.quota.borrowing_limit", ["greater than or equal to 0"], id="borrowing-negative"),
    pytest.param(cfg(team={"quota": {"gpus": 8, "lending_limit": 1.5}}),
                 "teams.0.quota.lending_limit", ["integer"], id="lending-fraction"),
    pytest.param(cfg(team={"quota": {"gpus": 8, "lend": 2}}), "teams.0.quota.lend",
                 ["unknown field"], id="quota-unknown-field"),
    pytest.param(cfg(team={"quota": {"gpus": {"H100": 8}}}), "teams.research.quota.gpus",
                 ["'H100'", "allowed: A100"], id="quota-type-not-in-a-pool"),
    pytest.param(cfg(teams=[{"name": "research", "quota": {"gpus": 8}},
                            {"name": "prod", "quota": {"gpus": {"A100": 8}}}]),
                 "teams.quota.gpus", ["per type: prod", "in total: research"], id="quota-kinds-mixed"),
    pytest.param(cfg(pool={"market": "cloud"}), "pools.0.market",
                 ["onprem", "on_demand", "spot", "'cloud'"], id="market-unknown"),
    pytest.param(cfg(pool={"provider": "azure"}), "pools.0.provider", ["local", "'azure'"],
                 id="provider-unknown"),
    pytest.param(cfg(pool={"gpus_per_node": 0}), "pools.0.gpus_per_node",
                 ["greater than or equal to 1"], id="gpus_per_node-zero"),
    pytest.param(cfg(pool={"gpus_per_node": -1}), "pools.0.gpus_per_node",
                 ["greater than or equal to 1"], id="gpus_per_node-negative"),
    pytest.param(cfg(pool={"gpus_per_node": 65}), "pools.0.gpus_per_node",
                 ["less than or equal to 64"], id="gpus_per_node-too-big"),
    pytest.param(cfg(pool={"nodes": -1}), "pools.0.nodes", ["greater than or equal to 0"],
                 id="nodes-negative"),
    pytest.param(cfg(pool={"price_per_node_hour": -0.5}), "pools.0.price_per_node_hour",
                 ["greater than or equal to 0"], id="price-negative"),
    pytest.param(cfg(pool={"name": "A100"}), "pools.0.name", [NAME_RULE, "'A100'"],
                 id="pool-name-uppercase"),
    pytest.param(cfg(pool={"name": "my pool"}), "pools.0.name", [NAME_RULE, "'my pool'"],
                 id="pool-name-space"),
    pytest.param(cfg(pool={"name": "-x"}), "pools.0.name", [NAME_RULE],
                 id="pool-name-leading-dash"),
    pytest.param(cfg(pool={"gpu_typ": "A100"}), "pools.0.gpu_typ", ["unknown field"],
                 id="pool-typo-field"),
    pytest.param(cfg(team={"name": "Team A"}), "teams.0.name", [NAME_RULE], id="team-name-bad"),
    pytest.param(cfg(team={"weight": 0}), "teams.0.weight", ["greater than 0"],
                 id="team-weight-zero"),
    pytest.param(cfg(team={"priority_allowance_gpus": -1}), "teams.0.priority_allowance_gpus",
                 ["greater than or equal to 0"], id="team-allowance-negative"),
    pytest.param(cfg(broker={"cycle_s": 0}), "broker.cycle_s", ["greater than 0"],
                 id="broker-cycle-zero"),
    pytest.param(cfg(broker={"grace_s": 7200}), "broker.grace_s", ["less than or equal to 3600"],
                 id="broker-grace-too-big"),
    pytest.param(cfg(broker={"cycle": 1}), "broker.cycle", ["unknown field"],
                 id="broker-typo-field"),
    pytest.param(cfg(broker={"max_start_failures": 0}), "broker.max_start_failures",
                 ["greater than or equal to 1"], id="broker-start-failures-zero"),
    pytest.param(cfg(pool_list=[]), "pool_list", ["unknown field"], id="top-level-typo"),
    pytest.param(cfg(pool={"price_per_node_hour": float("inf")}), "pools.0.price_per_node_hour",
                 ["finite number", "inf"], id="price-inf"),
    pytest.param(cfg(team={"weight": float("nan")}), "teams.0.weight", ["finite number", "nan"],
                 id="team-weight-nan"),
    pytest.param(cfg(team={"budget_usd": 1e400}), "teams.0.budget_usd", ["finite number"],
                 id="team-budget-1e400"),
    pytest.param(cfg(broker={"cycle_s": float("inf")}), "broker.cycle_s", ["finite number"],
                 id="broker-cycle-inf"),
    pytest.param(cfg(broker={"promote_gangs_only": "sometimes"}), "broker.promote_gangs_only",
                 ["valid boolean", "'sometimes'"], id="broker-aging-scope-not-a-bool"),
    pytest.param(cfg(broker={"oldest_gangs_first": "maybe"}), "broker.oldest_gangs_first",
                 ["valid boolean", "'maybe'"], id="broker-gangs-first-not-a-bool"),
    pytest.param(cfg(pool={"gpu_type": "A1\x0000"}), "pools.0.gpu_type", ["NUL byte"],
                 id="gpu-type-nul"),
    pytest.param(cfg(pool={"amortize": {"purchase_usd_per_node": 200000, "years": 0}}),
                 "pools.0.amortize.years", ["greater than 0"], id="amortize-years-zero"),
    pytest.param(cfg(pool={"amortize": {"years": 4}}), "pools.0.amortize.purchase_usd_per_node",
                 ["required"], id="amortize-missing-price"),
    pytest.param(cfg(pool={"amortize": {"purchase_usd_per_node": 1, "years": 4, "power": 0.1}}),
                 "pools.0.amortize.power", ["unknown field"], id="amortize-typo"),
    pytest.param(cfg(pool={"amortize": {"purchase_usd_per_node": 1, "years": 4},
                           "amortized_usd_per_gpu_hour": 1.0}), "pools.0",
                 ["give amortize", "not both"], id="amortize-and-typed-rate"),
    pytest.param(cfg(pool={"market": "spot", "amortized_usd_per_gpu_hour": 1.0}), "pools.0",
                 ["only on-prem pools are amortized", "spot"], id="amortize-rented"),
    pytest.param(cfg(pools=[]), "pools", ["at least 1"], id="no-pools"),
    pytest.param(without(cfg(), "pools", 0, "gpu_type"), "pools.0.gpu_type", ["required"],
                 id="pool-missing-gpu_type"),
    pytest.param(without(cfg(), "teams"), "teams", ["required"], id="missing-teams"),
    pytest.param(cfg(pools=[_pool(), _pool(gpu_type="H100")]), "pools",
                 ["duplicate name", "'a100'"], id="duplicate-pool-names"),
    pytest.param(cfg(teams=[{"name": "x"}, {"name": "x"}]), "teams",
                 ["duplicate name", "'x'"], id="duplicate-team-names"),
    # the leader's periodic tasks (issue 12): broker.tasks.<name>_s
    pytest.param(cfg(broker={"tasks": {"scale_down_s": 0}}), "broker.tasks.scale_down_s",
                 ["greater than or equal to 1", "0"], id="task-interval-zero"),
    pytest.param(cfg(broker={"tasks": {"enforce_budgets_s": 7200}}), "broker.tasks.enforce_budgets_s",
                 ["less than or equal to 3600"], id="task-budgets-too-rare"),
    pytest.param(cfg(broker={"tasks": {"retain_checkpoints_s": "hourly"}}),
                 "broker.tasks.retain_checkpoints_s", ["valid number", "'hourly'"], id="task-not-a-number"),
    pytest.param(cfg(broker={"tasks": {"sweep_s": 60}}), "broker.tasks.sweep_s", ["unknown field"],
                 id="task-unknown"),
    pytest.param(cfg(broker={"price_refresh_s": 60, "tasks": {"refresh_prices_s": 120}}), "broker",
                 ["tasks.refresh_prices_s", "price_refresh_s (its older name)"], id="task-given-twice"),
    pytest.param(cfg(broker={"rebalance": {"interval_s": 0}}), "broker.tasks.rebalance_s",
                 ["greater than or equal to 1"], id="task-older-key-checked-as-new"),
]


@pytest.mark.parametrize(("broker", "intervals"), [
    ({}, {"refresh_prices_s": 900, "rebalance_s": 300, "scale_down_s": 30, "sweep_orphans_s": 300,
          "enforce_budgets_s": 30, "decay_fair_share_s": 300, "retain_checkpoints_s": 3600}),
    ({"tasks": {"scale_down_s": 10, "retain_checkpoints_s": 600}}, {"scale_down_s": 10,
                                                                    "retain_checkpoints_s": 600}),
    # the spellings before `broker.tasks` still work, as their tasks fields
    ({"price_refresh_s": 120, "orphan_sweep_s": 60, "rebalance": {"interval_s": 90, "max_moves": 2}},
     {"refresh_prices_s": 120, "sweep_orphans_s": 60, "rebalance_s": 90}),
])
def test_task_intervals_come_from_broker_tasks(broker: dict[str, Any], intervals: dict[str, float]) -> None:
    got = parse_config(cfg(broker=broker)).broker
    assert {k: getattr(got.tasks, k) for k in intervals} == intervals
    assert got.rebalance.max_moves == broker.get("rebalance", {}).get("max_moves", 4)
    again = parse_config({**cfg(), "broker": got.model_dump(mode="json")}).broker  # as applied, stored
    assert again == got


@pytest.mark.parametrize(("data", "field", "mentions"), BAD_CONFIGS)
def test_bad_config_field_names_field_and_allowed(data: dict[str, Any], field: str,
                                                  mentions: list[str]) -> None:
    with pytest.raises(SpecError) as exc:
        parse_config(data)
    line = next((p for p in exc.value.problems if field in p), None)
    assert line is not None, f"no problem names {field!r}: {exc.value.problems}"
    for m in mentions:
        assert m in line, f"{m!r} missing from {line!r}"
    assert exc.value.source == "onepool.yaml"
    assert field in str(exc.value)


def test_quota_parsed_by_key() -> None:
    got = parse_config(cfg(team={"quota": {"gpus": {"A100": 8}, "borrowing_limit": 4}}))
    q = got.teams[0].quota
    assert q is not None and q.nominal() == {"A100": 8} and q.borrowing_limit == 4
    assert q.lending_limit is None and got.teams[1].quota is None
    total = parse_config(cfg(team={"quota": {"gpus": 16}})).teams[0].quota
    assert total is not None and total.nominal() == {"*": 16}


@pytest.mark.parametrize("data", [None, [], "pools: []", 3],
                         ids=["none", "list", "string", "int"])
def test_config_not_a_mapping(data: Any) -> None:
    with pytest.raises(SpecError) as exc:
        parse_config(data)
    assert exc.value.problems == ["(root): must be a mapping with 'pools' and 'teams'"]


def test_config_several_bad_fields_reported_together() -> None:
    data = cfg(pool={"market": "cloud", "gpus_per_node": 0, "gpu_typ": "x"},
               team={"name": "Bad Name"})
    with pytest.raises(SpecError) as exc:
        parse_config(data)
    text = problems_of(exc)
    assert len(exc.value.problems) >= 4
    for field in ("pools.0.market", "pools.0.gpus_per_node", "pools.0.gpu_typ", "teams.0.name"):
        assert field in text


# -- bad job fields ---------------------------------------------------------------------------
BAD_JOBS = [
    pytest.param(jobd(priority="vip"), "priority",
                 ["urgent", "high", "normal", "low", "'vip'"], id="priority-vip"),
    pytest.param(jobd(priority="URGENT"), "priority", ["urgent"], id="priority-wrong-case"),
    pytest.param(jobd(spot="maybe"), "spot", ["never", "allowed", "only", "'maybe'"],
                 id="spot-maybe"),
    pytest.param(jobd(gpus_per_node=0), "gpus_per_node", ["greater than or equal to 1"],
                 id="gpus_per_node-zero"),
    pytest.param(jobd(gpus_per_node=-1), "gpus_per_node", ["greater than or equal to 1"],
                 id="gpus_per_node-negative"),
    pytest.param(jobd(nodes=0), "nodes", ["greater than or equal to 1"], id="nodes-zero"),
    pytest.param(jobd(nodes=2000), "nodes", ["less than or equal to 1024"], id="nodes-too-many"),
    pytest.param(jobd(budget_usd=-1), "budget_usd", ["greater than or equal to 0"],
                 id="budget-negative"),
    pytest.param(jobd(checkpoint_interval_s=0), "checkpoint_interval_s", ["> 0 or 'auto'", "got 0"],
                 id="checkpoint-interval-zero"),
    pytest.param(jobd(checkpoint_interval_s="often"), "checkpoint_interval_s",
                 ["> 0 or 'auto'", "got 'often'"], id="checkpoint-interval-word"),
    pytest.param(jobd(checkpoint_interval_s=True), "checkpoint_interval_s", ["> 0 or 'auto'"],
                 id="checkpoint-interval-bool"),
    pytest.param(jobd(checkpoint_interval_s="-60"), "checkpoint_interval_s", ["> 0 or 'auto'"],
                 id="checkpoint-interval-negative-string"),
    pytest.param(jobd(checkpoint_interval_s=float("inf")), "checkpoint_interval_s", ["> 0 or 'auto'"],
                 id="checkpoint-interval-inf"),
    pytest.param(jobd(name="My Job"), "name", [NAME_RULE, "'My Job'"], id="name-space-upper"),
    pytest.param(jobd(team="NLP"), "team", [NAME_RULE], id="team-uppercase"),
    pytest.param(jobd(experiment="exp 1"), "experiment", [NAME_RULE], id="experiment-space"),
    pytest.param(jobd(gpu_typ=["A100"]), "gpu_typ", ["unknown field"], id="typo-gpu_typ"),
    pytest.param(jobd(env={"ONEPOOL_JOB_ID": "7"}), "env",
                 ["ONEPOOL_JOB_ID", "set by the broker"], id="env-onepool-prefix"),
    pytest.param(jobd(env={"CUDA_VISIBLE_DEVICES": "0"}), "env",
                 ["CUDA_VISIBLE_DEVICES", "set by the broker"], id="env-cuda-visible"),
    pytest.param(jobd(env={"1BAD": "x"}), "env", ["'1BAD'", "not a valid environment name"],
                 id="env-bad-name"),
    pytest.param(jobd(budget_usd=float("inf")), "budget_usd", ["finite number", "inf"],
                 id="budget-inf"),
    pytest.param(jobd(budget_usd=1e400), "budget_usd", ["finite number"], id="budget-1e400"),
    pytest.param(jobd(checkpoint_interval_s=float("nan")), "checkpoint_interval_s",
                 ["> 0 or 'auto'", "nan"], id="checkpoint-interval-nan"),
    pytest.param(jobd(expected_duration_s=float("inf")), "expected_duration_s", ["finite number"],
                 id="duration-inf"),
    pytest.param(jobd(command=["python", "tr\x00ain.py"]), "command", ["NUL byte", "item 1"],
                 id="command-nul"),
    pytest.param(jobd(command="python tr\x00ain.py"), "command", ["NUL byte"],
                 id="command-string-nul"),
    pytest.param(jobd(env={"TOKEN": "a\x00b"}), "env", ["NUL byte", "'TOKEN'"], id="env-value-nul"),
    pytest.param(jobd(workdir="/tmp/x\x00y"), "workdir", ["NUL byte"], id="workdir-nul"),
    pytest.param(jobd(command=[]), "command", ["at least 1"], id="command-empty-list"),
    pytest.param(jobd(command="   "), "command", ["at least 1"], id="command-blank-string"),
    # sizes below what Linux can start (E2BIG): each names the field and the limit
    pytest.param(jobd(command=["python", "x" * 200_000]), "command",
                 ["item 1 is 200000 bytes", "at most 64 KiB"], id="argument-200kb"),
    pytest.param(jobd(command=["a"] * 5000), "command", ["at most 4096 arguments", "5000"],
                 id="too-many-arguments"),
    pytest.param(jobd(command=["x" * 60_000] * 10), "command", ["total 600010 bytes", "at most 512 KiB"],
                 id="arguments-total"),
    pytest.param(jobd(env={"BLOB": "x" * 70_000}), "env", ["BLOB is 70005 bytes", "at most 64 KiB"],
                 id="env-value-too-big"),
    pytest.param(jobd(env={f"V{i}": "x" for i in range(300)}), "env", ["at most 256 variables", "300"],
                 id="env-too-many"),
    pytest.param(jobd(env={f"V{i}": "x" * 60_000 for i in range(5)}), "env",
                 ["total", "at most 256 KiB"], id="env-total"),
    pytest.param(jobd(env={"V" * 300: "x"}), "env", ["300 characters", "at most 255"], id="env-name-long"),
    pytest.param(jobd(workdir="/" + "w" * 5000), "workdir",
                 ["at most 4096 characters", "... (5003 characters)"], id="workdir-too-long"),
    pytest.param(jobd(gpu_types=["A100"] * 65), "gpu_types", ["at most 64 items"], id="gpu-types-many"),
    pytest.param(jobd(gpu_types=["A" * 41]), "gpu_types.0", ["at most 40 characters"],
                 id="gpu-type-long"),
    pytest.param(without(jobd(), "team"), "team", ["required"], id="missing-team"),
    pytest.param(without(jobd(), "name"), "name", ["required"], id="missing-name"),
    pytest.param(without(jobd(), "command"), "command", ["required"], id="missing-command"),
]


@pytest.mark.parametrize(("data", "field", "mentions"), BAD_JOBS)
def test_bad_job_field_names_field_and_allowed(data: dict[str, Any], field: str,
                                               mentions: list[str]) -> None:
    with pytest.raises(SpecError) as exc:
        parse_job(data)
    line = next((p for p in exc.value.problems if p.startswith(f"{field}:")
                 or p.startswith(f"{field}.")), None)
    assert line is not None, f"no problem names {field!r}: {exc.value.problems}"
    for m in mentions:
        assert m in line, f"{m!r} missing from {line!r}"


@pytest.mark.parametrize(("given", "value", "auto", "hint"), [
    ("auto", "auto", True, 1800.0), (" AUTO ", "auto", True, 1800.0), ("600", 600.0, False, 600.0),
    (90, 90.0, False, 90.0), (None, 1800.0, False, 1800.0),
])
def test_checkpoint_interval_values(given: Any, value: Any, auto: bool, hint: float) -> None:
    js = parse_job(jobd() if given is None else jobd(checkpoint_interval_s=given))
    assert (js.checkpoint_interval_s, js.checkpoint_auto, js.interval_hint_s) == (value, auto, hint)


@pytest.mark.parametrize("data", [None, ["python"], "python train.py"],
                         ids=["none", "list", "string"])
def test_job_not_a_mapping(data: Any) -> None:
    with pytest.raises(SpecError) as exc:
        parse_job(data)
    assert exc.value.problems == ["(root): must be a mapping of job fields"]


def test_job_several_bad_fields_reported_together() -> None:
    with pytest.raises(SpecError) as exc:
        parse_job(jobd(priority="vip", spot="maybe", nodes=0))
    text = problems_of(exc)
    assert len(exc.value.problems) >= 2
    assert "priority" in text and "spot" in text and "nodes" in text


def test_job_missing_fields_reported_together() -> None:
    with pytest.raises(SpecError) as exc:
        parse_job({"name": "x"})
    assert sorted(p.split(":")[0] for p in exc.value.problems) == ["command", "team"]
    assert all("required" in p for p in exc.value.problems)


@pytest.mark.parametrize(("command", "argv"), [
    ("python train.py --lr 0.1", ["python", "train.py", "--lr", "0.1"]),
    ("python 'my script.py' --x=1", ["python", "my script.py", "--x=1"]),
    ('bash -c "echo a; echo b"', ["bash", "-c", "echo a; echo b"]),
    (["python", "a b.py"], ["python", "a b.py"]),
], ids=["plain", "single-quoted", "double-quoted", "list-kept"])
def test_command_string_is_shlex_split(command: str | list[str], argv: list[str]) -> None:
    assert parse_job(jobd(command=command)).command == argv


def test_job_defaults() -> None:
    js = parse_job(jobd())
    assert js.priority is Priority.NORMAL
    assert js.spot is SpotPolicy.ALLOWED
    assert (js.nodes, js.gpus_per_node, js.gpus) == (1, 1, 1)
    assert js.experiment == "default"
    assert js.env == {} and js.gpu_types == []


def test_job_allowed_env_kept() -> None:
    js = parse_job(jobd(env={"BATCH": "32", "_X": ""}, gpus_per_node=4, nodes=2))
    assert js.env == {"BATCH": "32", "_X": ""}
    assert js.gpus == 8


# -- check_job_fits ---------------------------------------------------------------------------
@pytest.fixture
def two_pools() -> ClusterConfig:
    """a100: 2 nodes x 8 A100 on-prem; h100: 1 node x 4 H100 spot."""
    return parse_config(cfg(pools=[
        _pool(),
        _pool(name="h100", gpu_type="H100", gpus_per_node=4, nodes=1, market="spot"),
    ]))


FIT_ERRORS = [
    pytest.param(jobd(team="nlp"), ["team: must be one of research, prod", "'nlp'"],
                 id="unknown-team-lists-teams"),
    pytest.param(jobd(gpu_types=["V100"]), ["gpu_types:", "'V100'", "allowed: A100, H100"],
                 id="unknown-gpu-type-lists-types"),
    pytest.param(jobd(gpu_types=["A100"], nodes=3),
                 ["gpus_per_node/nodes", "3 node(s)", "a100: 2x8 A100"], id="too-many-nodes"),
    pytest.param(jobd(nodes=3), ["a100: 2x8 A100", "h100: 1x4 H100"],
                 id="too-many-nodes-lists-every-pool"),
    pytest.param(jobd(gpus_per_node=16), ["16 GPUs", "a100: 2x8 A100"],
                 id="too-many-gpus-per-node"),
    pytest.param(jobd(gpu_types=["H100"], spot="never"), ["spot", "spot=never"],
                 id="never-on-spot-only-type"),
]


@pytest.mark.parametrize(("data", "mentions"), FIT_ERRORS)
def test_check_job_fits_errors(two_pools: ClusterConfig, data: dict[str, Any],
                               mentions: list[str]) -> None:
    with pytest.raises(SpecError) as exc:
        parse_job(data, two_pools)
    text = problems_of(exc)
    for m in mentions:
        assert m in text, f"{m!r} missing from {text!r}"


def test_check_job_fits_team_and_type_reported_together(two_pools: ClusterConfig) -> None:
    with pytest.raises(SpecError) as exc:
        check_job_fits(parse_job(jobd(team="nlp", gpu_types=["X"])), two_pools)
    assert len(exc.value.problems) == 2


def test_three_node_job_on_two_node_pool() -> None:
    config = parse_config(cfg(pool={"nodes": 2, "gpus_per_node": 8}))
    with pytest.raises(SpecError) as exc:
        check_job_fits(parse_job(jobd(nodes=3)), config)
    (line,) = exc.value.problems
    assert line.startswith("gpus_per_node/nodes:")
    assert "3 node(s)" in line and "a100: 2x8 A100" in line


@pytest.mark.parametrize("data", [
    jobd(),
    jobd(nodes=2, gpus_per_node=8),
    jobd(gpu_types=["H100"], gpus_per_node=4),
    jobd(gpu_types=["A100", "H100"], spot="never"),
    jobd(team="prod", priority="urgent"),
], ids=["default", "full-a100", "full-h100", "never-falls-to-onprem", "other-team"])
def test_check_job_fits_ok(two_pools: ClusterConfig, data: dict[str, Any]) -> None:
    check_job_fits(parse_job(data), two_pools)


@pytest.mark.parametrize("spot", list(SpotPolicy), ids=[s.value for s in SpotPolicy])
def test_any_spot_policy_fits_onprem_only_cluster(spot: SpotPolicy) -> None:
    config = parse_config(cfg())  # one on-prem pool
    check_job_fits(parse_job(jobd(spot=spot.value)), config)


MARKET_OK = {
    (SpotPolicy.NEVER, Market.ONPREM): True,
    (SpotPolicy.NEVER, Market.ON_DEMAND): True,
    (SpotPolicy.NEVER, Market.SPOT): False,
    (SpotPolicy.ALLOWED, Market.ONPREM): True,
    (SpotPolicy.ALLOWED, Market.ON_DEMAND): True,
    (SpotPolicy.ALLOWED, Market.SPOT): True,
    (SpotPolicy.ONLY, Market.ONPREM): True,
    (SpotPolicy.ONLY, Market.ON_DEMAND): False,
    (SpotPolicy.ONLY, Market.SPOT): True,
}


def test_market_table_is_complete() -> None:
    assert set(MARKET_OK) == set(itertools.product(SpotPolicy, Market))


@pytest.mark.parametrize(("spot", "market", "ok"), [(s, m, ok) for (s, m), ok in MARKET_OK.items()],
                         ids=[f"{s.value}-{m.value}" for s, m in MARKET_OK])
def test_market_ok(spot: SpotPolicy, market: Market, ok: bool) -> None:
    assert market_ok(spot, market) is ok


# -- load_config ------------------------------------------------------------------------------
def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as exc:
        load_config(path)
    assert exc.value.source == str(path)
    assert str(path) in str(exc.value)
    (line,) = exc.value.problems
    assert "cannot read the file" in line and "No such file" in line


@pytest.mark.parametrize("text", ["pools: [\n", "pools:\n  - name: a\n bad: : :\n", "a: 'x\n"],
                         ids=["unclosed-list", "bad-indent", "unclosed-quote"])
def test_load_config_invalid_yaml(tmp_path: Path, text: str) -> None:
    path = tmp_path / "onepool.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as exc:
        load_config(path)
    (line,) = exc.value.problems
    assert line.startswith("not valid YAML")


def test_load_config_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "onepool.yaml"
    path.write_text("")
    with pytest.raises(SpecError) as exc:
        load_config(path)
    assert "must be a mapping" in problems_of(exc)


def test_load_config_bad_field_names_file(tmp_path: Path) -> None:
    path = tmp_path / "onepool.yaml"
    path.write_text(yaml.safe_dump(cfg(pool={"market": "cloud"})))
    with pytest.raises(SpecError) as exc:
        load_config(path)
    assert exc.value.source == str(path)
    assert "pools.0.market" in problems_of(exc)


# -- round trips ------------------------------------------------------------------------------
def test_valid_config_round_trips(tmp_path: Path) -> None:
    data = cfg(pools=[_pool(), _pool(name="h100", gpu_type="H100", market="spot",
                                     price_per_node_hour=12.5, region="us-east-1")])
    config = parse_config(data)
    dumped = config.model_dump(mode="json")
    assert parse_config(dumped) == config
    path = tmp_path / "onepool.yaml"
    path.write_text(yaml.safe_dump(dumped))
    assert load_config(path) == config
    assert config.gpu_types() == ["A100", "H100"]
    assert config.pool("h100").market is Market.SPOT
    assert config.broker.cycle_s == 1.0


def test_valid_job_round_trips() -> None:
    js = parse_job(jobd(command="python train.py --x 1", priority="high", spot="only",
                        env={"A": "b"}, gpu_types=["A100"], budget_usd=40))
    again = parse_job(js.model_dump(mode="json"))
    assert again == js
    assert isinstance(again, JobSpec) and again.priority is Priority.HIGH
