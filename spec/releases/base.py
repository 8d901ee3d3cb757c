"""The base release and what a delta on it is (chapter 9 of spec/README.md).

Chapters 1 to 8 describe vLLM **0.25.1**, the *base*.  Each later release
the spec knows is one module beside this one (``v0_26_0``, ``v0_27_0``,
...): its :class:`Delta` records, each with its prose.  Nothing here
imports kvspec or vLLM; run as a script, the module prints the base release
(``tools/install_vllm.sh`` reads it so, before kvspec is installed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BASE = "0.25.1"
"""The release the chapters before chapter 9 describe."""

MODELLED, OUTSIDE, NOT_MODELLED = "modelled", "outside", "not-modelled"


def version_key(version: str) -> tuple[int, ...]:
    """``"0.31.0rc1"`` -> ``(0, 31, 0)``: a release's numbers, for ordering
    releases (a pre-release orders with its release).  A string that is no
    version is a ``ValueError`` naming it."""
    match = re.match(r"v?(\d+(?:\.\d+)*)", str(version).strip())
    if not match:
        raise ValueError(f"{version!r} is not a vLLM release (expected a version such as {BASE!r})")
    return tuple(int(n) for n in match[1].split("."))


@dataclass(frozen=True)
class Delta:
    """One change a release made to the block manager, as the spec reads it."""

    release: str
    key: str
    change: str
    rules: tuple[str, ...] = ()
    vectors: tuple[str, ...] = ()
    status: str = MODELLED
    shows_on: tuple[str, ...] = ()
    """For a delta not modelled: the conformance layouts where a target on the release can break a rule."""


if __name__ == "__main__":
    print(BASE)
