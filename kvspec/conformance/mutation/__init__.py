"""Mutation testing of the gate: faults planted in impl (and in vLLM) that
the gate must catch.

``mutants`` names each planted fault and the rule it breaks; ``mutate`` runs
the gate against each, in fresh processes, and reports which ones it caught
and how fast (``kvspec mutate``).
"""
