"""kvspec: an executable specification, a production implementation and a
conformance suite for vLLM v1's KV-cache block manager (reference: vLLM 0.25.1).

Layers (each a subpackage, each a top-level folder in the repository):

- ``kvspec.spec``  -- the rules, as a model that runs (``spec/``)
- ``kvspec.impl``  -- the fast, vLLM-compatible implementation (``impl/``)
- ``kvspec.conformance`` -- state machines that check any target against the spec
- ``kvspec.hashing`` -- how a block's content is named (shared by spec and impl)
"""

__version__ = "0.1.0"
