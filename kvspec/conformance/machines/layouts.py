"""Model layouts the request-level machine builds: small pools, small blocks,
every attention type and the hybrids that combine them.

Block sizes are tiny (2 and 4 tokens) and token alphabets small so that a
few dozen operations already share prefixes, fill windows and evict.
"""

from __future__ import annotations

from kvspec.spec.layout import Layout
from kvspec.testing import chunked, cross, full, mamba, mla, rswa, swa

MANAGER_LAYOUTS: dict[str, Layout] = {
    "full": Layout((full(2),)),
    "mla": Layout((mla(2),)),
    # Context parallelism (DeepSeek's MLA decoded over 2 ranks, prefilled over 2): each rank holds 1
    # token of a block, so the manager counts blocks of 4 tokens and hashes every 4.
    "mla-dcp2-pcp2": Layout((mla(1),), use_eagle=True, dcp_world_size=2, pcp_world_size=2),
    "full+swa": Layout((full(2), swa(2, window=4))),
    "full+swa-bigger-blocks": Layout((full(2), swa(4, window=6))),
    # Reference sliding window: the prompt stays, generated tokens beyond the window are released.
    "rswa": Layout((rswa(2, window=4),), max_model_len=48),
    "full+chunked": Layout((full(2), chunked(2, chunk=4))),
    "full+mamba-align": Layout((full(2), mamba(2, "align"))),
    "full+mamba-all": Layout((full(2), mamba(2, "all"))),
    "full+swa+mamba": Layout((full(2), swa(2, window=4), mamba(2, "align")), num_blocks=32),
    "full+swa-eagle": Layout((full(2), swa(2, window=4)), use_eagle=True),
    # The drafter's group marked, use_eagle off: how vLLM 0.33's scheduler builds an EAGLE model's manager
    # when block hashes cover the drafter's lookahead.  The base drops the marked group's last hit block
    # anyway; from 0.33 (delta eagle-drop-needs-use-eagle) no group drops.
    "full+swa-marked": Layout((full(2), swa(2, window=4)), eagle_groups=(0,)),
    # vLLM turns prefix caching off for encoder-decoder models.
    "encoder-decoder": Layout((full(2), cross(2)), enable_caching=False),
    "caching-off": Layout((full(2), swa(2, window=4)), enable_caching=False),
    # Two full-attention specs (block sizes 2 and 4) and a window that cuts the hit below theirs:
    # every full-attention group's hit must be cut to the final length (vLLM cuts the first only).
    "two-full-specs": Layout((full(2), full(4), swa(2, window=4)), num_blocks=32),
    # EAGLE with no group flagged: every group but Mamba is an EAGLE group (drafters have no Mamba
    # layers; vLLM makes Mamba one too and its hit outruns full attention).
    "full+mamba-eagle": Layout((full(2), mamba(2, "all")), use_eagle=True),
    # EAGLE over three spec groups; chunked local attention cannot be an EAGLE group, so the
    # drafter's groups are flagged and the chunked group's shrinks reset the EAGLE verifications.
    "eagle-3-groups": Layout(
        (full(2), swa(2, window=4), chunked(2, chunk=4)), num_blocks=32, use_eagle=True, eagle_groups=(0, 1)
    ),
    # Mamba align mode with speculative decoding: 0-2 drafts per step, two speculative state blocks
    # (one per draft), Mamba blocks of 4 so that a step crosses at most one boundary; the drafter's
    # group (full attention) is flagged, so Mamba is no EAGLE group in vLLM either.
    "full+mamba-align-drafts": Layout(
        (full(2), mamba(4, "align", speculative=2)), use_eagle=True, eagle_groups=(0,)
    ),
    # Mamba outside align mode with speculative blocks: every state cached, two draft-state blocks.
    "full+mamba-all-drafts": Layout(
        (full(2), mamba(4, "all", speculative=2)), use_eagle=True, eagle_groups=(0,)
    ),
    # A scheduler block (8) spanning more than a window's run of blocks (window 3 over blocks of 2: a
    # hit reads the last 2 of each segment's 4), so the window caches a sparse mask of its blocks.
    "full8+swa2-sparse": Layout((full(8), swa(2, window=3)), num_blocks=32, max_model_len=48),
    # A prefix-cache retention interval (vLLM's VLLM_PREFIX_CACHE_RETENTION_INTERVAL): the window and
    # the Mamba state keep one checkpoint per 8 tokens (and the one a replay of the prompt hits), not
    # every block a hit could use.
    "full+swa+mamba-retention": Layout(
        (full(2), swa(2, window=4), mamba(2, "align")), num_blocks=32, retention_interval=8
    ),
    # A token budget per step (6) below the model's length: a sliding-window request holds at most the
    # window plus one step's tokens, so the full-sequence admission estimate is capped (at 6 blocks here).
    "full+swa-budget6": Layout((full(2), swa(2, window=4)), max_num_batched_tokens=6),
    # Mamba blocks (2) smaller than the scheduler block (4): every state is cached, but a hit must end
    # where full attention's can, so a state at an odd Mamba block boundary is never one.
    "full4+mamba2-all": Layout((full(4), mamba(2, "all"))),
    # Retention 0: Mamba keeps only the state a replay of the prompt hits.
    "full+mamba-align-retention0": Layout((full(2), mamba(2, "align")), retention_interval=0),
    # Retention 0 with a drafter: the window keeps only the blocks a replay of the prompt resumes at, which
    # a drafter moves a scheduler block lower from 0.30 (delta eagle-replay-boundaries).
    "full+swa-eagle-retention0": Layout((full(2), swa(2, window=4)), use_eagle=True, retention_interval=0),
}

LATER_LAYOUTS: dict[str, Layout] = {
    # Decode context parallelism on a hybrid model (a Qwen3-Next-like model decoded over 2 ranks),
    # which a release from 0.26.0 on takes (delta dcp-on-hybrid-models): full attention's blocks are
    # split over the ranks (1 token a rank, so the manager counts blocks of 2), the Mamba state is
    # replicated on each rank (blocks of 2).
    "full+mamba-align-dcp2": Layout((full(1), mamba(2, "align")), dcp_world_size=2),
    # The same with full-attention blocks of 2 tokens a rank: a block spans 4 tokens, two hash blocks of 2
    # (the Mamba block's), where 0.29 takes hits inside a block (delta partial-hits-under-dcp, not modelled).
    "full2+mamba-align-dcp2": Layout((full(2), mamba(2, "align")), dcp_world_size=2),
}
"""Manager layouts that exist only in a later release than the base: the
gate searches one where the spec of the release judged builds it, and
names why it skips it elsewhere."""
