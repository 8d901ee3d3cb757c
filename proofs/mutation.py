"""Mutating production code in memory, one function at a time.

A :class:`Mutation` names a function of kvspec's code (``module`` and
``qualname``, e.g. ``kvspec.impl.block_pool`` / ``BlockPool.free_blocks``),
a snippet of its source and what to put there instead.  :meth:`apply` reads
the function's source, replaces the snippet (it must occur exactly once),
compiles the result in the function's own module -- same globals, same
``from __future__ import annotations``, and a ``__class__`` cell so that a
method's ``super()`` still works -- and installs it where the original was,
for this process only.  Nothing on disk changes.

The proof runner plants one mutation per obligation over impl
(:mod:`kvspec.proofs.impl_faults`) and requires CrossHair to refute it: an
obligation that a wrong implementation also satisfies proves nothing.
"""

from __future__ import annotations
import __future__

import importlib
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Mutation:
    """Replace ``old`` by ``new`` in the source of ``module``'s ``qualname``."""

    module: str
    qualname: str
    old: str
    new: str
    why: str
    """What is wrong with the mutated code, in one line."""

    def owner_and_name(self) -> tuple[Any, str]:
        """The module or class holding the function, and its attribute name."""
        owner: Any = importlib.import_module(self.module)
        *path, name = self.qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        return owner, name

    def mutated_source(self) -> str:
        owner, name = self.owner_and_name()
        original = inspect.getattr_static(owner, name)
        function = original.__func__ if isinstance(original, (classmethod, staticmethod)) else original
        source = textwrap.dedent(inspect.getsource(function))
        if isinstance(original, classmethod) and "@classmethod" not in source:
            source = "@classmethod\n" + source
        if isinstance(original, staticmethod) and "@staticmethod" not in source:
            source = "@staticmethod\n" + source
        found = source.count(self.old)
        if found != 1:
            raise ValueError(f"mutation of {self.module}.{self.qualname}: {self.old!r} occurs {found} times, not once")
        return source.replace(self.old, self.new)

    def apply(self) -> None:
        """Install the mutated function in place of the original."""
        owner, name = self.owner_and_name()
        module = importlib.import_module(self.module)
        body = textwrap.indent(self.mutated_source(), "    ")
        # Nested in a function whose local is __class__: zero-argument super() finds it.
        wrapper = f"def _mutant(__class__):\n{body}\n    return {name}\n"
        code = compile(wrapper, f"<mutant {self.module}.{self.qualname}>", "exec",
                       flags=__future__.annotations.compiler_flag, dont_inherit=True)
        namespace: dict[str, Any] = {}
        exec(code, vars(module), namespace)  # noqa: S102 (the point: a mutant of our own code)
        setattr(owner, name, namespace["_mutant"](owner if inspect.isclass(owner) else None))

    def preamble(self) -> str:
        """Source lines that apply this mutation when run (a planted file's first lines)."""
        return (
            "from kvspec.proofs.mutation import Mutation as _Mutation\n"
            f"_Mutation({self.module!r}, {self.qualname!r}, {self.old!r}, {self.new!r}, {self.why!r}).apply()\n"
        )
