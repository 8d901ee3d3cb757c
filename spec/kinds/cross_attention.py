"""Cross attention: keys and values of the request's encoder outputs, never
a prefix of anyone else's, so never cached and never hit (spec/README.md,
chapter 8)."""

from __future__ import annotations

from kvspec.errors import RuleError
from kvspec.kv_cache_interface import AttentionKind
from kvspec.spec.kinds.group import (
    GroupManager,
)


class CrossAttention(GroupManager):
    """The decoder's view of the encoder output: allocated once per request
    from ``num_encoder_tokens``, never shared, never cached (a model with a
    cross-attention group runs with prefix caching off)."""

    kind = AttentionKind.CROSS_ATTENTION

    def take_hits(self, rid, hits, num_local_computed, num_external_computed):
        """Cross attention never has hits, and ignores the request's prefix."""

    def allocate_external(self, rid, num_local_computed, num_external_computed):
        """External KV connectors do not load encoder states."""

    def cache(self, request, num_tokens, retention, replay=None):
        raise RuleError("hash-map-consistency", "cross-attention blocks are never cached")

    @classmethod
    def find_hit(cls, spec, lookup, max_length, drop_eagle, alignment):
        raise RuleError("hash-map-consistency", "cross-attention blocks are never cached")
