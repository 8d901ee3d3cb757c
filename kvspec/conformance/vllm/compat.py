"""vLLM's releases as kvspec knows them: the reference release and every
switch on the release.

kvspec's spec is vLLM 0.25.1's block manager (:data:`REFERENCE_RELEASE`).
Later releases changed what the adapters see, not what the rules say; each
change is one entry here, named by the release that made it, so that
adding a release means reading this file, not searching the tree:

- :data:`TAGGED_EXTRA_KEYS` (0.31): block-hash extra keys lead with their
  kind (``("lora", name, path)``, ``("mm", id, offset)``, ...);
- :data:`SESSION_ID` (0.30): ``Request.session_id``, read into KV events;
- :data:`SHARED_PREFIX_BOUNDARY` (0.33): ``get_computed_blocks`` returns a
  third value after ``(blocks, num_hits)``.

Nothing here imports vLLM: the switches take the release as a string (the
installed one: :func:`installed_release`).  Run as a script, the module
prints the reference release (``tools/install_vllm.sh`` reads it so).
"""

from __future__ import annotations

from typing import Any

REFERENCE_RELEASE = "0.25.1"
"""The release the spec describes, the drop-in replaces and the vllm
target is built for."""

TAGGED_EXTRA_KEYS = (0, 31)
SESSION_ID = (0, 30)
SHARED_PREFIX_BOUNDARY = (0, 33)


def release(version: str) -> tuple[int, ...]:
    """``"0.31.0rc1"`` -> ``(0, 31, 0)``: the release's numbers, for comparing with the switches."""
    from packaging.version import Version

    return Version(version).release


def installed_release() -> str | None:
    """The installed vLLM's version, read from its metadata without importing it (``None``: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


def release_warning(installed: str | None) -> str | None:
    """What a run against vLLM says when the installed release is not the
    reference: which release is judged by which spec, and where the known
    differences of later releases are listed (``None``: nothing to say)."""
    if installed is None or release(installed) == release(REFERENCE_RELEASE):
        return None
    relation = "later than" if release(installed) > release(REFERENCE_RELEASE) else "older than"
    return (f"warning: vLLM {installed} is installed, {relation} the release kvspec's spec describes "
            f"({REFERENCE_RELEASE}); it is judged by {REFERENCE_RELEASE}'s rules -- what later releases changed "
            "in the block manager is listed in docs/findings.md (the version matrix)")


def extra_key_format(version: str) -> str:
    """The extra-key format of a release: ``bare`` (the reference, through
    0.30) or ``tagged`` (from 0.31: every key is a tuple led by its kind --
    ``("lora", name, path)``, ``("mm", id, offset)``, ``("cache_salt",
    salt)``, ``("prompt_embeds", digest)`` -- so that keys of different
    kinds never collide).  KV events keep the bare format."""
    return "tagged" if release(version) >= TAGGED_EXTRA_KEYS else "bare"


def hit_of(computed: Any) -> tuple[Any, int]:
    """``(blocks, num_hits)`` of what a release's ``get_computed_blocks``
    returned: the pair through 0.32, the pair and the shared-prefix
    boundary from 0.33."""
    blocks, num_hits = tuple(computed)[:2]
    return blocks, num_hits


if __name__ == "__main__":
    print(REFERENCE_RELEASE)
