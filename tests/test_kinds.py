"""One vocabulary of attention kinds (:class:`kvspec.kv_cache_interface.AttentionKind`):
every kind is served everywhere a kind is needed.  Adding a kind fails here
until each place knows it (docs/CONTRIBUTING.md, "Add an attention kind")."""

import pytest

from kvspec.impl.single_type_kv_cache_manager import MANAGER_FOR_KIND
from kvspec.kv_cache_interface import (
    EVENT_KIND,
    KIND_OF_CLASS,
    AttentionKind,
    KVCacheSpecKind,
    attention_kind,
    get_kv_cache_spec_kind,
    managed_kind,
)
from kvspec.spec.kinds import GROUP_CLASSES, group_class
from kvspec.spec.layout import view_of
from kvspec.testing import chunked, cross, full, mamba, mla, rswa, swa

EXAMPLES = {
    AttentionKind.FULL_ATTENTION: full(2), AttentionKind.MLA_ATTENTION: mla(2), AttentionKind.RSWA: rswa(2, window=4),
    AttentionKind.SLIDING_WINDOW: swa(2, window=4), AttentionKind.CHUNKED_LOCAL_ATTENTION: chunked(2, chunk=4),
    AttentionKind.MAMBA: mamba(2, "align"), AttentionKind.CROSS_ATTENTION: cross(2),
}
MANAGED = {kind for kind in AttentionKind if kind is not AttentionKind.MLA_ATTENTION}


def test_every_kind_has_a_spec_class_and_a_testing_constructor():
    assert {kind for _, kind in KIND_OF_CLASS} == set(AttentionKind) == set(EXAMPLES)


@pytest.mark.parametrize("kind", list(AttentionKind))
def test_a_spec_sorts_into_its_kind_everywhere(kind):
    spec = EXAMPLES[kind]
    assert attention_kind(spec) is kind
    managed = managed_kind(spec)
    assert view_of(spec, eagle=False).kind is managed
    assert group_class(spec).kind is managed
    assert MANAGER_FOR_KIND[managed] is not None
    assert get_kv_cache_spec_kind(spec) is EVENT_KIND[kind]


def test_every_managed_kind_has_a_spec_group_manager_and_an_impl_manager():
    assert set(GROUP_CLASSES) == MANAGED == set(MANAGER_FOR_KIND)


def test_event_kinds_are_vllms_names():
    assert set(EVENT_KIND) == set(AttentionKind)
    assert all(isinstance(name, KVCacheSpecKind) for name in EVENT_KIND.values())
    assert EVENT_KIND[AttentionKind.RSWA] is KVCacheSpecKind.FULL_ATTENTION  # vLLM 0.25.1 reports RSWA so


def test_a_foreign_spec_has_no_kind_and_is_refused_naming_it():
    from kvspec.errors import RuleError
    from kvspec.kv_cache_interface import KVCacheSpec

    class Odd(KVCacheSpec):
        pass

    odd = Odd(block_size=2)
    assert attention_kind(odd) is None and get_kv_cache_spec_kind(odd) is KVCacheSpecKind.UNKNOWN
    with pytest.raises(RuleError, match="unsupported KV-cache spec Odd"):
        group_class(odd)
    with pytest.raises(TypeError, match="unsupported KV-cache spec Odd"):
        view_of(odd, eagle=False)


def test_every_impl_manager_is_exported_and_put_in_vllm_by_the_dropin():
    """A kind's impl manager is public (``kvspec.impl.__all__``) and the
    drop-in puts it in place of vLLM's class of that name, so that no vLLM
    manager class is left beside kvspec's pool (issue 29: RSWAManager was
    missing from both)."""
    from kvspec import dropin, impl

    classes = {cls.__name__ for cls in MANAGER_FOR_KIND.values()}
    assert classes <= set(impl.__all__), classes - set(impl.__all__)
    replaced = set(dropin.REPLACED["vllm.v1.core.single_type_kv_cache_manager"][1])
    assert classes <= replaced, classes - replaced


def test_each_kind_is_one_page_of_the_spec():
    """spec/kinds/: every managed kind's group manager in a module of its own,
    each under 250 lines -- a chapter a porter reads whole (what they share,
    group.py, under 300)."""
    import inspect
    from pathlib import Path

    import kvspec.spec.kinds

    modules = {inspect.getmodule(cls).__name__ for cls in GROUP_CLASSES.values()}
    assert len(modules) == len(GROUP_CLASSES), "two kinds share a module"
    for name in modules:
        assert name.startswith("kvspec.spec.kinds.")
    for path in Path(kvspec.spec.kinds.__file__).parent.glob("*.py"):
        lines = len(path.read_text().splitlines())
        assert lines < 300 if path.name == "group.py" else lines < 250, f"{path.name}: {lines} lines"
