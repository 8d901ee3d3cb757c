"""Rule allocation-accounting's ``metrics_follow_the_blocks``: what a metrics
collector given to the manager hears (vLLM's ``KVCacheMetricsCollector``
interface), driven here on kvspec's impl by hand -- a hit, a reuse of cached
blocks, an explicit eviction, a reset -- and with one call muted."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvspec.conformance.machines.observe import MetricsLog, observe
from kvspec.conformance.targets.manager import ImplManagerTarget
from kvspec.hashing import get_request_block_hasher
from kvspec.request import Request, RequestStatus
from kvspec.spec.layout import Layout
from kvspec.spec.request_rules import RequestContext, expected_residency, metrics_follow_the_blocks
from kvspec.testing import full, swa


class NeverToldOfReuse(MetricsLog):
    """A collector that does not hear a residency end (mutant metrics-miss-reuse's effect)."""

    def on_block_evicted(self, block) -> None:
        pass


def drive(layout: Layout, log: MetricsLog) -> tuple[list[str], list[tuple[str, int | None]]]:
    """A short life of the pool: two requests share a prefix, a third
    reuses the cached blocks, one id is evicted, the cache is reset.
    Returns the rule's problems and every call the collector heard."""
    target = layout.make_target(ImplManagerTarget, metrics_collector=log)
    ctx, problems, heard = RequestContext(layout=layout), [], []

    def op(name, *args, **kwargs):
        log.take()
        step = observe(target, name, *args, **kwargs)
        step = replace(step, residency=log.take())
        heard.extend(step.residency)
        problems.extend(metrics_follow_the_blocks(step, ctx))
        return step.result

    def serve(rid, tokens):
        request = Request(rid, tokens, block_hasher=get_request_block_hasher(layout.hash_block_size))
        hit, n = op("get_computed_blocks", request)
        op("allocate_slots", request, len(tokens) - n, n, hit)
        request.num_computed_tokens, request.status = len(tokens), RequestStatus.RUNNING
        return request

    first = serve("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    second = serve("b", [1, 2, 3, 4, 5, 6, 7, 8, 10])  # hits the first four blocks
    op("free", first)
    op("free", second)
    op("evict_blocks", {2})
    third = serve("c", list(range(20, 40)))  # takes cached blocks back from the free queue
    op("free", third)
    op("reset_prefix_cache")
    return problems, heard


@pytest.mark.parametrize("layout", [Layout((full(2),), num_blocks=12), Layout((full(2), swa(2, window=4)),
                                                                              num_blocks=24)],
                         ids=["full", "full+swa"])
def test_impl_tells_the_collector_every_residency(layout):
    problems, heard = drive(layout, MetricsLog())
    assert problems == []
    calls = {call for call, _ in heard}
    assert calls == {"allocated", "accessed", "evicted", "reset"}  # every kind of call happened


def test_a_collector_never_told_of_reuse_is_caught():
    layout = Layout((full(2),), num_blocks=12)
    problems, _ = drive(layout, NeverToldOfReuse())
    assert any("missed evicted" in p for p in problems)
    assert any("allocated without its previous residency evicted" in p for p in problems)


def test_without_caching_no_eviction_precedes_an_allocation():
    layout = Layout((full(2),), num_blocks=12, enable_caching=False)
    problems, heard = drive(layout, MetricsLog())
    assert problems == []
    assert [c for c in heard if c[0] == "allocated"] and not [c for c in heard if c[0] == "accessed"]


def test_calls_naming_the_null_block_do_not_count():
    """vLLM tells the collector of the null blocks in a window's hit; no rule reads them."""
    layout = Layout((full(2),), num_blocks=12)
    target = layout.make_target(ImplManagerTarget)
    step = observe(target, "evict_blocks", {0, 3})
    assert expected_residency(step, layout) == [("evicted", 0), ("evicted", 3)]
    assert metrics_follow_the_blocks(replace(step, residency=(("evicted", 3), ("accessed", 0))),
                                     RequestContext(layout=layout)) == []
