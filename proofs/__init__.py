"""CrossHair proof obligations over fixed-size models of the pool.

- :mod:`kvspec.proofs.pool_model` -- the block pool restated over four blocks
  in immutable tuples (free queue as signed freed-at stamps), each operation
  a pure function with a PEP 316 contract whose ``post:`` lines state the
  rules (ref-conservation, free-queue-consistency, null-exclusion,
  free-order, hash-map-consistency).  Every obligation is confirmed over all
  paths.
- :mod:`kvspec.proofs.pool_model_buggy` -- planted bugs under the same
  contracts; CrossHair must find a counterexample for each.
- :mod:`kvspec.proofs.run` -- runs ``crosshair check`` per function and
  reports each obligation as confirmed / counterexample / timed out / unable
  to meet precondition / error (``python -m kvspec.proofs.run [--planted]``).
"""
