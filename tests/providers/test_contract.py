"""The Provider contract (providers.base.Provider), run against every provider: local, AWS
(moto), GCP (the Compute fake), libcloud (EC2's signatures) and libcloud's Azure ARM driver.
Provider-specific launches (subnets, zones, accelerators, images, driver arguments) are in
test_aws.py, test_gcp.py and test_libcloud.py."""

from __future__ import annotations

import pytest

from providers.base import TAG_BROKER, TAG_JOB, TAG_NODE, TAG_POOL, Fatal, NoCapacity, Transient
from tests.providers.harness import BOOT, BROKER, Harness


def test_launch_is_idempotent_on_its_token(harness: Harness) -> None:
    req = harness.req()
    a = harness.provider.launch(req)
    b = harness.provider.launch(req)
    assert a.instance_id == b.instance_id
    assert [i.instance_id for i in harness.provider.poll(BROKER)] == [a.instance_id]
    harness.provider.terminate(a.instance_id)


def test_every_instance_carries_the_broker_pool_node_and_job_ids(harness: Harness) -> None:
    inst = harness.provider.launch(harness.req(job=42))
    [seen] = harness.provider.poll(BROKER)
    assert {k: seen.tags.get(k) for k in (TAG_BROKER, TAG_POOL, TAG_NODE, TAG_JOB)} == {
        TAG_BROKER: BROKER, TAG_POOL: "pool-a", TAG_NODE: "pool-a-0001", TAG_JOB: "42"}
    assert seen.node_id == "pool-a-0001"
    harness.provider.terminate(inst.instance_id)


def test_the_instance_boots_the_requests_user_data(harness: Harness) -> None:
    """The boot script reaches the instance where it runs it (EC2 user data, GCE
    startup-script, the libcloud driver's user-data argument, Azure custom data)."""
    if harness.boot_script is None:
        pytest.skip(f"{harness.name} runs no boot script")
    inst = harness.provider.launch(harness.req())
    assert harness.boot_script(inst.instance_id) == BOOT
    harness.provider.terminate(inst.instance_id)


def test_a_spot_request_runs_on_spot(harness: Harness) -> None:
    if harness.market_of is None or harness.market != "spot":
        pytest.skip(f"{harness.name} does not tell spot from on-demand")
    inst = harness.provider.launch(harness.req())
    assert harness.market_of(inst.instance_id) == "spot"
    harness.provider.terminate(inst.instance_id)
    on_demand = harness.provider.launch(harness.req(node="pool-a-0002", token="tok-0002", market="on_demand"))
    assert harness.market_of(on_demand.instance_id) == "on_demand"
    harness.provider.terminate(on_demand.instance_id)


def test_terminate_of_a_missing_or_gone_node_returns_quietly(harness: Harness) -> None:
    inst = harness.provider.launch(harness.req())
    harness.provider.terminate(inst.instance_id)
    harness.provider.terminate(inst.instance_id)  # already gone
    harness.provider.terminate(_missing_id(harness))  # never existed
    assert harness.provider.poll(BROKER) == []


def test_poll_lists_only_this_brokers_live_instances(harness: Harness) -> None:
    mine = harness.provider.launch(harness.req())
    other = harness.provider.launch(harness.req(node="pool-a-0002", token="tok-other", broker="op-other"))
    gone = harness.provider.launch(harness.req(node="pool-a-0003", token="tok-0003"))
    harness.provider.terminate(gone.instance_id)
    assert [i.instance_id for i in harness.provider.poll(BROKER)] == [mine.instance_id]
    assert [i.instance_id for i in harness.provider.poll("op-other")] == [other.instance_id]
    for i in (mine, other):
        harness.provider.terminate(i.instance_id)


def test_describe_finds_an_instance_by_id_and_none_once_it_is_gone(harness: Harness) -> None:
    inst = harness.provider.launch(harness.req())
    found = harness.provider.describe(inst.instance_id)
    assert found is not None and found.instance_id == inst.instance_id
    assert found.node_id == "pool-a-0001"
    harness.provider.terminate(inst.instance_id)
    assert harness.provider.describe(inst.instance_id) is None
    assert harness.provider.describe(_missing_id(harness)) is None


def test_notices_come_again_until_acknowledged(harness: Harness) -> None:
    harness.provider.ack([])  # nothing to acknowledge: quiet, also without a channel
    if harness.notify is None:
        assert harness.provider.interruptions() == []
        return
    inst = harness.provider.launch(harness.req())
    harness.notify(inst.instance_id)
    [first] = harness.provider.interruptions()
    assert first.instance_id == inst.instance_id and first.kind == "spot_interruption" and first.key
    [again] = harness.provider.interruptions()  # not acknowledged: delivered again, same key
    assert again.key == first.key
    harness.provider.ack([again])
    harness.provider.ack([again])  # twice: quiet
    assert harness.provider.interruptions() == []
    harness.provider.terminate(inst.instance_id)


ERRORS = [("capacity", NoCapacity), ("quota", NoCapacity), ("fatal", Fatal), ("unexpected", Fatal)]


@pytest.mark.parametrize(("kind", "error"), ERRORS, ids=[k for k, _ in ERRORS])
def test_native_errors_are_mapped(harness: Harness, kind: str, error: type[Exception]) -> None:
    if kind not in harness.kinds:
        pytest.skip(f"{harness.name} has no {kind} error")
    assert harness.fail is not None
    harness.fail(kind, 1)
    with pytest.raises(error) as e:
        harness.provider.launch(harness.req())
    assert "pool" in str(e.value) or "check" in str(e.value) or "credentials" in str(e.value)
    assert harness.provider.poll(BROKER) == []


def test_throttling_is_retried_then_succeeds(harness: Harness) -> None:
    if "throttle" not in harness.kinds:
        pytest.skip(f"{harness.name} does not throttle")
    assert harness.fail is not None
    harness.fail("throttle", 2)
    inst = harness.provider.launch(harness.req())
    assert [i.instance_id for i in harness.provider.poll(BROKER)] == [inst.instance_id]
    harness.provider.terminate(inst.instance_id)


def test_throttling_that_does_not_stop_surfaces_as_transient(harness: Harness) -> None:
    if "throttle" not in harness.kinds:
        pytest.skip(f"{harness.name} does not throttle")
    assert harness.fail is not None
    harness.fail("throttle", 100)
    with pytest.raises(Transient):
        harness.provider.launch(harness.req())


def _missing_id(h: Harness) -> str:
    return {"aws": "i-0123456789abcdef0", "gcp": "us-central1-a/onepool-missing-node",
            "libcloud-azure": "/subscriptions/x/resourceGroups/onepool/providers/Microsoft.Compute/"
                              "virtualMachines/missing"}.get(h.name, "onepool-missing-node")
