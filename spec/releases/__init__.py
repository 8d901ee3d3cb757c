"""Releases: which vLLM release the spec describes, and what each later one changed.

The chapters before this one describe vLLM **0.25.1**, the *base*
(:mod:`.base`).  vLLM ships a release a month; a release that changes what
its block manager does, or what it answers, is one module in this package
(``v0_26_0``, ``v0_27_0``, ...: :data:`RELEASE_MODULES`) holding its
:class:`Delta` records on the release before -- the way a protocol's forks
are written as deltas on their predecessor -- so that a reader targeting
release R reads the base chapters and then the deltas up to R, oldest
first (:func:`deltas_until`), and nothing else.  Adding a release is one
new module here (docs/CONTRIBUTING.md, "Adding a vLLM release").

Each delta says:

- the **release** that made the change and a **key** that names it;
- what changed, in prose (the **change**);
- the **rules** whose reading changes with it (none: the rules stand and
  only what a target answers, or which inputs exist, changed);
- the **vectors** that judge it (none yet: said so);
- its **status**: ``modelled`` (the spec follows the release: a switch on
  :class:`Release` that the rules or the machines read), ``outside`` (the
  change is outside what the spec judges -- an answer the neutral
  interface leaves out, a feature the release removed -- and the delta
  says exactly what is not judged), or ``not-modelled`` (the release does
  something the spec does not describe yet: a target on that release may
  break a rule there for no fault of its own; the delta names the layouts
  where it shows).

A release is judged by the rules of the newest release the spec knows at
or before it (:func:`judged`): a release newer than every known one is
judged by the newest known one's rules, and says so.  Rules that no delta
names are release-independent: ref-conservation holds in every release.

Nothing here imports vLLM; releases are version strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from kvspec.spec.releases import (
    v0_26_0,
    v0_27_0,
    v0_27_1,
    v0_28_0,
    v0_29_0,
    v0_30_0,
    v0_31_0,
    v0_32_0,
    v0_33_0,
    v0_34_0,
)
from kvspec.spec.releases.base import BASE, MODELLED, NOT_MODELLED, OUTSIDE, Delta, version_key
from kvspec.spec.releases.v0_29_0 import FIXED_ROOT_SEED

__all__ = ["BASE", "DELTAS", "DELTA_KEYS", "FIXED_ROOT_SEED", "KNOWN", "MODELLED", "NOT_MODELLED", "OUTSIDE",
           "REFERENCE", "RELEASE_MODULES", "Delta", "Release", "as_release", "deltas_until", "judged", "version_key"]

RELEASE_MODULES = (v0_26_0, v0_27_0, v0_27_1, v0_28_0, v0_29_0, v0_30_0, v0_31_0, v0_32_0, v0_33_0, v0_34_0)
"""One module per release after the base whose block manager was read for
deltas, oldest first: each names its ``RELEASE`` and the ``PREVIOUS`` one,
and holds its ``DELTAS`` with their prose (none: the release changed nothing
the spec judges)."""

DELTAS: tuple[Delta, ...] = tuple(d for module in RELEASE_MODULES for d in module.DELTAS)
"""Every delta, oldest release first."""

DELTA_KEYS = frozenset(d.key for d in DELTAS)

KNOWN = (BASE, *(module.RELEASE for module in RELEASE_MODULES))
"""Every release the spec knows: the base and each later one whose block
manager was read for deltas (one module each).  The catalogue is not complete yet: a survey of
every change from 0.26 to 0.34 (docs/release-survey.md) lists those not yet
written as deltas, and a release may differ from its spec where one shows."""


@dataclass(frozen=True)
class Release:
    """A vLLM release as the spec judges it.  ``version`` is the release
    asked about; ``known`` is the release whose rules judge it (the newest
    known one at or before it)."""

    version: str
    known: str

    def __reduce__(self) -> tuple:
        # Pickled by name (a manager's all-or-nothing copy pickles its pool, which holds its release): one
        # release of a process stays one object, its deltas computed once.
        return _interned, (self.version, self.known)

    @cached_property
    def deltas(self) -> tuple[Delta, ...]:
        """The deltas from the base to this release, oldest first."""
        return deltas_until(self.known)

    @cached_property
    def _keys(self) -> frozenset[str]:
        return frozenset(d.key for d in self.deltas)

    def has(self, key: str) -> bool:
        """Whether the delta ``key`` is in force in this release (the rules ask it at every operation)."""
        if key not in DELTA_KEYS:
            raise ValueError(f"no release delta is named {key!r} (known: {', '.join(d.key for d in DELTAS)})")
        return key in self._keys

    @property
    def is_base(self) -> bool:
        return self.known == BASE

    @property
    def beyond_known(self) -> bool:
        """Newer than every release the spec knows: judged by the newest known one's rules."""
        return version_key(self.version) > version_key(KNOWN[-1])

    @property
    def extra_key_format(self) -> str:
        """``bare`` (the base) or ``tagged`` (delta ``tagged-extra-keys``)."""
        return "tagged" if self.has("tagged-extra-keys") else "bare"

    @property
    def mm_resume_scan(self) -> str:
        """``last`` (the base) or ``overlapping`` (delta ``mm-keys-on-resume``):
        where a hasher resuming inside a request looks for multimodal inputs."""
        return "overlapping" if self.has("mm-keys-on-resume") else "last"

    @property
    def fixed_root_seed(self) -> str | None:
        """The seed an unseeded process roots its hash chains at (delta
        fixed-root-hash), or ``None``: random bytes, as in the base."""
        return FIXED_ROOT_SEED if self.has("fixed-root-hash") else None

    def unsupported(self, mamba_modes: set[str]) -> str | None:
        """Why a layout whose Mamba groups use ``mamba_modes`` (with prefix
        caching) does not exist in this release, or ``None``."""
        if "all" in mamba_modes and self.has("mamba-all-removed"):
            return f"vLLM {self.version} has no Mamba `all` cache mode (release delta mamba-all-removed, 0.33.0)"
        return None

    def not_modelled(self, layout: str) -> str | None:
        """Why the conformance layout ``layout`` (``scope/name``) is not
        judged on this release, or ``None``: a delta of the release that the
        spec does not model yet shows there (its ``shows_on``), so a target
        may break a rule there for no fault of its own.  The gate skips such
        a layout with this reason, naming the delta; a layout the delta does
        not name is judged as usual."""
        for delta in self.deltas:
            if delta.status == NOT_MODELLED and layout in delta.shows_on:
                return f"not modelled: release delta {delta.key} ({delta.release})"
        return None

    def warning(self) -> str | None:
        """What a run on this release says about how it is judged (``None``: it is the base)."""
        if version_key(self.version) < version_key(BASE):
            return (f"warning: vLLM {self.version} is older than {BASE}, the oldest release kvspec's spec "
                    f"describes; it is judged by {BASE}'s rules")
        if self.is_base:
            return None
        if self.beyond_known:
            return (f"warning: vLLM {self.version} is newer than every release kvspec's spec knows; it is judged by "
                    f"the rules of {self.known}, the newest known (spec/README.md, chapter Releases)")
        missing = [d.key for d in self.deltas if d.status == NOT_MODELLED]
        note = f"; not modelled yet: {', '.join(missing)}" if missing else ""
        count = f"{len(self.deltas)} delta{'s' if len(self.deltas) != 1 else ''}"
        return (f"note: judged by the rules of vLLM {self.version}: the spec of {self.known} "
                f"(base {BASE} + {count}{note})")


_INTERNED: dict[tuple[str, str], Release] = {}


def _interned(version: str, known: str) -> Release:
    """The one :class:`Release` of ``version`` judged by ``known``'s rules."""
    return _INTERNED.setdefault((version, known), Release(version, known))


def deltas_until(version: str) -> tuple[Delta, ...]:
    """The deltas of every release after the base up to ``version``, oldest first."""
    key = version_key(version)
    return tuple(d for d in DELTAS if version_key(d.release) <= key)


def judged(version: str) -> Release:
    """The release ``version`` as the spec judges it: by its own rules when
    the spec knows it, else by those of the newest known release before it
    (the base for anything older than the base)."""
    key = version_key(version)
    known = [k for k in KNOWN if version_key(k) <= key]
    return _interned(version, known[-1] if known else BASE)


REFERENCE = judged(BASE)
"""The base release, as a :class:`Release`: what the spec judges when it is
told no other.  There is no process-wide "current" release: whatever
depends on the release judged -- the spec's pool and managers, a
:class:`~kvspec.spec.layout.Layout`, impl, the conformance targets and
machines, the vectors, the findings -- is given it, as a value, where it is
built, and a constructor called without one builds for this release (so that
callers written before releases existed keep working)."""


def as_release(release: Release | str | None) -> Release:
    """``release`` as a :class:`Release`: one given as a version string is
    judged (:func:`judged`), ``None`` is the reference release
    (:data:`REFERENCE`)."""
    if release is None:
        return REFERENCE
    if isinstance(release, Release):
        return release
    return judged(release)

