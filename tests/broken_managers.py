"""Deliberately broken managers, usable as ``module:factory`` targets of the
CLI (``kvspec conform --target broken_managers:IgnoresTenant``)."""

from types import SimpleNamespace

from kvspec.conformance.targets.spec_manager import SpecManagerTarget
from kvspec.hashing import get_request_block_hasher
from kvspec.request import Request


def without_tenant(request, hash_block_size: int) -> Request:
    """The same tokens (and prompt embeddings) with no cache salt or LoRA."""
    plain = Request(request.request_id, request.prompt_token_ids, prompt_embeds=request.prompt_embeds,
                    block_hasher=get_request_block_hasher(hash_block_size))
    plain.append_output_token_ids(list(request.output_token_ids))
    return plain


class IgnoresTenant(SpecManagerTarget):
    """Looks up prefixes without the cache salt / LoRA and trusts any hit:
    one tenant is served another's blocks (tenant-isolation)."""

    def get_computed_blocks(self, request):
        return super().get_computed_blocks(without_tenant(request, self.hash_block_size))

    def _require_hits_allowed(self, request, hits, num_external):
        # Checks its hits against the blocks' tokens alone: a hit cached under another tenant passes.
        return super()._require_hits_allowed(without_tenant(request, self.hash_block_size), hits, num_external)



def hasher_ignoring_embeddings(hash_block_size: int):
    """A block hasher that leaves prompt embeddings out of the hash (kvspec's
    own did, once): prompts with the same placeholder ids get the same hashes."""
    plain = get_request_block_hasher(hash_block_size)

    def hasher(request):
        return plain(SimpleNamespace(block_hashes=request.block_hashes, num_tokens=request.num_tokens,
                                     all_token_ids=request.all_token_ids, lora_request=request.lora_request,
                                     cache_salt=request.cache_salt, mm_features=request.mm_features))

    return hasher
