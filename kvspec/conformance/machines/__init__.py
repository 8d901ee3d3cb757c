"""The conformance machines: Hypothesis state machines that drive a target
and the executable spec side by side and check every rule after every step.

``machinery`` is what they share (the checking base class, refusals, budgets,
traces of each step); ``observe`` reads a target through its interface;
``layouts`` names the KV-cache layouts they run on and ``catalogue`` is
the index of every scope's layouts; ``configurations`` the incoherent
variants of a layout that a target must refuse to be built with; ``pool``,
``manager``, ``scheduler``, ``cache``, ``offload`` and ``kernel`` are the machines, one
per scope -- the block pool, the KV-cache manager, vLLM's own scheduler, any engine's
prefix cache seen through its content view (spec chapter 10), an
offloading tier of KV blocks (spec chapter 11), and the
kernel stage that feeds block tables to attention kernels.
"""
