"""Deliberately broken cache-scope targets (spec chapter 10), usable as
``module:factory`` targets (``kvspec conform --scope cache --target
broken_caches:KeepsLock``).  Each plants one fault an engine of any design
could have, on kvspec's own manager seen through the content view."""

from broken_managers import IgnoresTenant
from kvspec.conformance.targets.cache import ManagerCacheTarget
from kvspec.conformance.targets.spec_manager import SpecManagerTarget
from kvspec.spec.engines import CacheView


class _Broken(ManagerCacheTarget):
    def __init__(self, layout):
        super().__init__(layout, SpecManagerTarget)


def keeps_lock(layout):
    """A finished request's lock is never released: its blocks stay held (ref-conservation)."""

    class KeepsLock(_Broken):
        def view(self) -> CacheView:
            view = super().view()
            holds = dict(view.holds)
            for b in self.gone:
                holds[b] = holds.get(b, 0) + 1
            return CacheView(view.blocks, view.block_size, view.free - self.gone, view.tables, holds, view.cached)

        gone: frozenset = frozenset()

        def finish(self, request_id):
            table = self.manager.snapshot().tables.get(request_id, ((),))[0]
            super().finish(request_id)
            self.gone = self.gone | {b for b in table if b}

    return KeepsLock(layout)


def shares_tenants(layout):
    """Prefixes are looked up without the tenant: one adapter is served another's KV."""
    return ManagerCacheTarget(layout, IgnoresTenant)


def serves_freed(layout):
    """Evicted content stays in the index: a freed block, reused, is still served as what it held."""

    class ServesFreed(_Broken):
        remembered: dict = {}

        def view(self) -> CacheView:
            view = super().view()
            self.remembered = {**self.remembered, **view.cached}
            cached = {b: k for b, k in self.remembered.items() if b not in view.free}
            return CacheView(view.blocks, view.block_size, view.free, view.tables, view.holds, cached)

    return ServesFreed(layout)
