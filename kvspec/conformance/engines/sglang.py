"""SGLang at cache scope (placeholder until its adapter lands)."""

from __future__ import annotations

import importlib.util

from kvspec.spec.engines import CacheLayout


def problem() -> str | None:
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not installed"
    return "kvspec has no SGLang adapter yet"


def unsupported(layout: CacheLayout) -> str | None:
    return None


def target(layout: CacheLayout):
    raise NotImplementedError
