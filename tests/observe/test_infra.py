"""infra/prometheus and infra/grafana: promtool checks the rules and runs their unit tests (one
per alert), and every metric a rule or a dashboard panel names is one onepool exposes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from broker.agent.agent import Agent
from broker.agent.hardware import Gpus
from broker.clock import FakeClock
from broker.observe.agent_metrics import AgentCollector
from broker.observe.metrics import names, registry_for
from broker.state.store import Store

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "infra" / "prometheus" / "onepool-rules.yml"
RULE_TESTS = ROOT / "infra" / "prometheus" / "onepool-rules.test.yml"
DASHBOARD = ROOT / "infra" / "grafana" / "dashboards" / "onepool.json"
# A metric name in PromQL: onepool_ followed by name characters (labels and functions aside).
METRIC = re.compile(r"\bonepool_[a-zA-Z0-9_]+")


def promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool is missing: infra/test/install-prometheus.sh installs Debian's prometheus")
    return tool


def test_promtool_checks_the_rules():
    r = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_unit_test_and_they_pass():
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    tested = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for t in case["alert_rule_test"]}
    assert alerts == tested
    fired = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
             for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert fired == alerts  # each alert is shown firing, not only silent
    r = subprocess.run([promtool(), "test", "rules", RULE_TESTS.name], capture_output=True, text=True,
                       cwd=RULE_TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr


def exposed(tmp_path: Path) -> set[str]:
    """The series names of the server's /metrics and of an agent's listener."""
    server = names(registry_for(Store(tmp_path / "home"), FakeClock()))
    agent = Agent(server="http://127.0.0.1:9", state_dir=tmp_path / "agent",
                  gpus=Gpus(2, "A100", ("A100",), "flags"))
    reg = CollectorRegistry()
    reg.register(AgentCollector(agent))
    return server | names(reg)


def used_in_rules() -> set[str]:
    return {m for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
            for m in METRIC.findall(r["expr"])}


def used_in_dashboard() -> set[str]:
    dash = json.loads(DASHBOARD.read_text())
    return {m for p in dash["panels"] for t in p.get("targets", []) for m in METRIC.findall(t["expr"])}


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_named_in_infra_is_exposed(tmp_path: Path, source: str):
    used = used_in_rules() if source == "rules" else used_in_dashboard()
    assert len(used) >= 5
    assert used <= exposed(tmp_path), sorted(used - exposed(tmp_path))


def test_the_dashboard_uses_the_provisioned_datasource():
    dash = json.loads(DASHBOARD.read_text())
    ds = yaml.safe_load((ROOT / "infra" / "grafana" / "provisioning" / "datasources" / "onepool.yml")
                        .read_text())["datasources"][0]["uid"]
    assert {p["datasource"]["uid"] for p in dash["panels"]} == {ds}
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
