"""CrossHair proof obligations: a model of the pool, and impl's own code.

- :mod:`kvspec.proofs.pool_model` -- the block pool restated over four blocks
  in immutable tuples (free queue as signed freed-at stamps), each operation
  a pure function with a PEP 316 contract whose ``post:`` lines state the
  rules; :mod:`kvspec.proofs.pool_model_buggy` plants bugs under the same
  contracts.
- :mod:`kvspec.proofs.impl_windows`, :mod:`kvspec.proofs.impl_pool`,
  :mod:`kvspec.proofs.impl_managers` -- bounded harnesses over impl's
  production functions and classes, checked against every rule and, in
  lockstep, against the spec; :mod:`kvspec.proofs.impl_faults` holds one
  mutation of impl's code per obligation (:mod:`kvspec.proofs.mutation`
  applies it in memory) that the obligation must refute.
- :mod:`kvspec.proofs.tracing` -- where a harness leaves CrossHair's tracer
  to check concrete values at native speed.
- :mod:`kvspec.proofs.run` -- runs ``crosshair check`` per function and
  reports each obligation as confirmed / counterexample / not confirmed in
  budget / precondition unsatisfiable / error (``kvspec prove [--planted]``).
"""
