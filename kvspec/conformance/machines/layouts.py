"""Model layouts the request-level machine builds: small pools, small blocks,
every attention type and the hybrids that combine them.

Block sizes are tiny (2 and 4 tokens) and token alphabets small so that a
few dozen operations already share prefixes, fill windows and evict.
"""

from __future__ import annotations

from kvspec.spec.layout import Layout
from kvspec.testing import chunked, cross, full, mamba, mla, rswa, swa

ManagerLayout = Layout
"""The conformance machines' name for :class:`kvspec.spec.layout.Layout`."""


MANAGER_LAYOUTS: dict[str, ManagerLayout] = {
    "full": ManagerLayout((full(2),)),
    "mla": ManagerLayout((mla(2),)),
    "full+swa": ManagerLayout((full(2), swa(2, window=4))),
    "full+swa-bigger-blocks": ManagerLayout((full(2), swa(4, window=6))),
    # Reference sliding window: the prompt stays, generated tokens beyond the window are released.
    "rswa": ManagerLayout((rswa(2, window=4),), max_model_len=48),
    "full+chunked": ManagerLayout((full(2), chunked(2, chunk=4))),
    "full+mamba-align": ManagerLayout((full(2), mamba(2, "align"))),
    "full+mamba-all": ManagerLayout((full(2), mamba(2, "all"))),
    "full+swa+mamba": ManagerLayout((full(2), swa(2, window=4), mamba(2, "align")), num_blocks=32),
    "full+swa-eagle": ManagerLayout((full(2), swa(2, window=4)), use_eagle=True),
    # vLLM turns prefix caching off for encoder-decoder models.
    "encoder-decoder": ManagerLayout((full(2), cross(2)), enable_caching=False),
    "caching-off": ManagerLayout((full(2), swa(2, window=4)), enable_caching=False),
    # Two full-attention specs (block sizes 2 and 4) and a window that cuts the hit below theirs:
    # every full-attention group's hit must be cut to the final length (vLLM cuts the first only).
    "two-full-specs": ManagerLayout((full(2), full(4), swa(2, window=4)), num_blocks=32),
    # EAGLE with no group flagged: every group but Mamba is an EAGLE group (drafters have no Mamba
    # layers; vLLM makes Mamba one too and its hit outruns full attention).
    "full+mamba-eagle": ManagerLayout((full(2), mamba(2, "all")), use_eagle=True),
    # EAGLE over three spec groups; chunked local attention cannot be an EAGLE group, so the
    # drafter's groups are flagged and the chunked group's shrinks reset the EAGLE verifications.
    "eagle-3-groups": ManagerLayout(
        (full(2), swa(2, window=4), chunked(2, chunk=4)), num_blocks=32, use_eagle=True, eagle_groups=(0, 1)
    ),
    # Mamba align mode with speculative decoding: 0-2 drafts per step, two speculative state blocks
    # (one per draft), Mamba blocks of 4 so that a step crosses at most one boundary; the drafter's
    # group (full attention) is flagged, so Mamba is no EAGLE group in vLLM either.
    "full+mamba-align-drafts": ManagerLayout(
        (full(2), mamba(4, "align", speculative=2)), use_eagle=True, eagle_groups=(0,)
    ),
}
