"""Deliberately broken managers, usable as ``module:factory`` targets of the
CLI (``kvspec conform --target broken_managers:IgnoresTenant``)."""

from kvspec.conformance.spec_manager_target import SpecManagerTarget
from kvspec.hashing import get_request_block_hasher
from kvspec.request import Request


class IgnoresTenant(SpecManagerTarget):
    """Looks up prefixes without the cache salt / LoRA and trusts any hit:
    one tenant is served another's blocks (tenant-isolation)."""

    def get_computed_blocks(self, request):
        plain = Request(request.request_id, request.all_token_ids,
                        block_hasher=get_request_block_hasher(self.hash_block_size))
        return super().get_computed_blocks(plain)

    def _require_hits_allowed(self, request, hits, num_external):
        return None
