"""kvspec's block manager inside vLLM 0.25.1: the drop-in mode.

The public name of :mod:`kvspec.conformance.vllm.dropin`, where the code
lives with the rest of what meets vLLM's API (the vLLM seam)::

    import kvspec.dropin
    kvspec.dropin.install()      # vLLM's block manager is now kvspec.impl's
    kvspec.dropin.uninstall()    # and vLLM's again

or ``KVSPEC_DROPIN=1 vllm serve ...``: kvspec registers :func:`plugin`
under vLLM's ``vllm.general_plugins`` entry points.  Importing this module
imports no vLLM.
"""

from kvspec.conformance.vllm.dropin import REPLACED, install, installed, plugin, uninstall

__all__ = ["REPLACED", "install", "installed", "plugin", "uninstall"]
