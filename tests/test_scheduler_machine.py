"""Scheduler scope: vLLM's own Scheduler over its block manager (and over
kvspec's, through the drop-in), a scripted KV connector, every request rule
after every step.

Under tools/install_vllm.sh's environment:
``PYTHONHASHSEED=0 .venv-vllm/bin/python -m pytest tests/test_scheduler_machine.py``.
"""

import pytest

pytest.importorskip("vllm")

from kvspec import dropin  # noqa: E402
from kvspec.conformance.machines.scheduler import (  # noqa: E402
    SCHEDULER_LAYOUTS,
    SchedulerHarness,
    search,
)
from kvspec.conformance.vllm.scheduler_findings import SCHEDULER_FINDINGS, replay  # noqa: E402


@pytest.fixture
def on_kvspec():
    dropin.install()
    try:
        yield
    finally:
        dropin.uninstall()


def test_the_connector_is_loaded_as_a_third_party_connector_and_loads_land_in_the_shadow():
    h = SchedulerHarness(SCHEDULER_LAYOUTS["full"])
    assert type(h.connector).__name__ == "ScriptedConnector"
    h.arrive([5] * 40, max_tokens=2, remote_tokens=32, load="sync")
    assert h.step() == []
    assert "loads r0 tokens 0..32" in h.trace[-1] and "r0: 32+8" in h.trace[-1]
    assert h.step() == [] and h.step() == []
    assert not h.scheduler.requests  # finished: 2 tokens sampled


def test_an_async_load_waits_for_the_worker_then_runs_on_the_loaded_prefix():
    h = SchedulerHarness(SCHEDULER_LAYOUTS["full"])
    h.arrive([5] * 40, max_tokens=1, remote_tokens=32, load="async")
    assert h.step() == [] and "async r0 tokens 0..32" in h.trace[-1] and "nothing scheduled" in h.trace[-1]
    assert h.step() == []  # the worker reports the load received
    assert h.step() == [] and any("r0: 32+8" in line for line in h.trace[-2:])


def test_the_read_rule_catches_a_computed_count_no_block_backs():
    """The rule under the machine, shown failing: tamper with what the
    scheduler believes is computed, and the next step's read is flagged."""
    h = SchedulerHarness(SCHEDULER_LAYOUTS["full"])
    h.arrive([5] * 40, max_tokens=3)
    assert h.step() == []
    h.scheduler.requests["r0"].num_computed_tokens -= 8  # as if 8 computed tokens were never written...
    h.shadow.slots.clear()  # ...and nothing was: every computed token is now unbacked
    problems = h.step()
    assert problems and problems[0].rule == "content-soundness" and "r0 counts 32 tokens computed" in str(problems[0])


@pytest.mark.parametrize("finding_id", ["S1", "S1-align", "S2"])
def test_scheduler_findings_reproduce_on_vllm(finding_id):
    status, detail = replay(SCHEDULER_FINDINGS[finding_id])
    assert status == "reproduces" and detail.startswith("content-soundness"), detail


def test_s3_a_hybrid_load_failure_crashes_vllm_0_25_1():
    status, detail = replay(SCHEDULER_FINDINGS["S3"])
    assert status == "raises" and "too many values to unpack" in detail, detail


def test_the_machine_rediscovers_the_per_group_hit_bug_46453():
    """vLLM#46453's line -- the max over per-group hits of a Mamba hybrid
    with a connector -- found from scratch: the state of a shorter prefix is
    read as the state of the full-attention hit."""
    failure = search(SCHEDULER_LAYOUTS["full+mamba-all"], ("none", "sync", "async"), 200)
    assert failure is not None and "content-soundness" in failure and "group 1:" in failure, failure


def test_the_machine_finds_s2_from_scratch():
    failure = search(SCHEDULER_LAYOUTS["full"], ("none", "sync-fail"), 250)
    assert failure is not None and "content-soundness" in failure and "holds nothing" in failure, failure


def test_full_attention_is_clean_without_failing_loads():
    assert search(SCHEDULER_LAYOUTS["full"], ("none", "sync", "async"), 60) is None


def test_kvspec_under_vllms_scheduler_is_clean_where_vllms_manager_is(on_kvspec):
    harness = SchedulerHarness(SCHEDULER_LAYOUTS["full"])
    from kvspec import impl

    assert isinstance(harness.scheduler.kv_cache_manager, impl.KVCacheManager)
    assert search(SCHEDULER_LAYOUTS["full"], ("none", "sync", "async"), 60) is None


def test_kvspec_under_vllms_scheduler_inherits_the_schedulers_own_bugs(on_kvspec):
    """S1 and S2 live in vLLM's scheduler, not its block manager: under the
    drop-in they reproduce all the same."""
    for finding_id in ("S1", "S1-align", "S2"):
        status, detail = replay(SCHEDULER_FINDINGS[finding_id])
        assert status == "reproduces", (finding_id, detail)


def test_eagle_drafts_are_scheduled_accepted_and_rejected_with_every_rule_holding():
    h = SchedulerHarness(SCHEDULER_LAYOUTS["full+swa-eagle"], num_draft_tokens=2)
    h.arrive([3] * 40, max_tokens=40)
    for _ in range(5):
        assert h.step() == []
    decode_steps = [line for line in h.trace if "r0: " in line and "+3" in line]
    assert len(decode_steps) >= 3  # one token and two drafts a step
    # A rejected draft's slot holds junk: counting it as computed is caught at the next read.
    request = h.scheduler.requests["r0"]
    h.shadow.scribble(request, h.manager.get_block_ids("r0"), request.num_computed_tokens - 1,
                      request.num_computed_tokens)
    problems = h.step()
    assert problems and "a rejected draft token of r0" in str(problems[0]), problems


def test_drafts_need_an_eagle_layout_and_no_mamba():
    with pytest.raises(ValueError, match="use_eagle"):
        SchedulerHarness(SCHEDULER_LAYOUTS["full"], num_draft_tokens=2)
    with pytest.raises(ValueError, match="attention-only"):
        SchedulerHarness(SCHEDULER_LAYOUTS["full+mamba-align"], num_draft_tokens=2)


def test_the_eagle_layout_is_clean_with_drafts():
    assert search(SCHEDULER_LAYOUTS["full+swa-eagle"], ("none", "sync", "async"), 60) is None
