"""Targets: adapters that present an implementation through the spec's
target interface (:mod:`kvspec.spec.interface`).

``pool`` adapts block pools with vLLM's ``BlockPool`` API (the spec's and
impl's; vLLM's own derives from it), ``manager`` adapts managers with vLLM's
``KVCacheManager`` API (impl's), ``spec_manager`` the spec's manager,
``cache`` a manager of vLLM's design as a cache-scope target (its content
view, spec chapter 10), ``offload`` any manager with vLLM's
``OffloadingManager`` API as the offload machine drives it (spec chapter
11), and
``remote`` a target living in another Python process (a fork's upstream,
run in lockstep with it: ``kvspec conform --against``).  The adapters of
vLLM's own classes live in :mod:`kvspec.conformance.vllm`.
"""
