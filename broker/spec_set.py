"""`--set PATH=VALUE`: change one setting of an onepool.yaml, validated by the one config
source (broker.spec.parse_config).

PATH walks the config's mapping with dots; a list of named items (`pools`, `teams`) is walked
by the item's name: `broker.grace_s=120`, `teams.nlp.weight=2`, `pools.a100.nodes=4`,
`broker.rebalance.min_saving_usd=5`. VALUE is read as YAML (`120`, `2.5`, `true`, `null`,
`[a, b]`). A key the config does not have is refused by the config's own validation
("unknown field"), and a bad value by its field's rule; an unknown pool or team names the
ones there are.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from broker.errors import SpecError
from broker.spec import ClusterConfig, parse_config

NAMED_LISTS = ("pools", "teams")


def parse_set(item: str) -> tuple[list[str], Any]:
    """`a.b.c=VALUE` -> (["a", "b", "c"], VALUE read as YAML). Raises SpecError naming the form."""
    path, sep, raw = item.partition("=")
    keys = [k.strip() for k in path.split(".")]
    if not sep or not all(keys):
        raise SpecError("--set", [f"{item!r}: expected PATH=VALUE with a dotted PATH, e.g. "
                                  "broker.grace_s=120 or teams.nlp.weight=2"])
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        raise SpecError("--set", [f"{path}: the value is not valid YAML (got {raw!r})"]) from None
    return keys, value


def apply_sets(data: dict[str, Any], items: list[str], source: str = "--set") -> dict[str, Any]:
    """A copy of the config mapping `data` with each `PATH=VALUE` of `items` applied (see the
    module docstring). Only the walking is checked here; validate the result with
    parse_config (with_sets does both)."""
    out = copy.deepcopy(data)
    for item in items:
        keys, value = parse_set(item)
        node: Any = out
        for i, key in enumerate(keys[:-1]):
            where = ".".join(keys[: i + 1])
            if isinstance(node, list):
                names = [x.get("name") for x in node if isinstance(x, dict)]
                if key not in names:
                    raise SpecError(source, [f"{where}: no such item; known: {', '.join(map(str, names))}"])
                node = node[names.index(key)]
                continue
            if not isinstance(node, dict):
                raise SpecError(source, [f"{where}: is a value, not a section"])
            if key not in node or node[key] is None:
                if key in NAMED_LISTS:
                    raise SpecError(source, [f"{where}: the config has none to change"])
                node[key] = {}
            node = node[key]
        if isinstance(node, list):
            where = ".".join(keys[:-1])
            raise SpecError(source, [f"{where}: name an item, e.g. {where}.NAME.{keys[-1]}=VALUE"])
        if not isinstance(node, dict):
            raise SpecError(source, [f"{'.'.join(keys[:-1])}: is a value, not a section"])
        node[keys[-1]] = value
    return out


def with_sets(cfg: ClusterConfig, items: list[str]) -> ClusterConfig:
    """`cfg` with `items` applied and validated again. Raises SpecError naming the field (an
    unknown key, a bad value and the rule it breaks)."""
    if not items:
        return cfg
    data = apply_sets(cfg.model_dump(mode="json", exclude_unset=True), items)
    try:
        return parse_config(data, "--set")
    except SpecError as e:  # name the items as --set does: teams.1.weight -> teams.nlp.weight
        names = {f"{k}.{i}.": f"{k}.{x.get('name')}." for k in NAMED_LISTS
                 for i, x in enumerate(data.get(k) or []) if isinstance(x, dict)}
        raise SpecError("--set", [_named(p, names) for p in e.problems]) from None


def _named(problem: str, names: dict[str, str]) -> str:
    for index, name in names.items():
        if problem.startswith(index):
            return name + problem[len(index):]
    return problem
