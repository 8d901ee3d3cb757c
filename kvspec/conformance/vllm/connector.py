"""A scripted KV connector for vLLM's scheduler: a remote KV store whose
contents the test chooses.

vLLM loads it as any third-party connector (``KVTransferConfig(kv_connector=
"ScriptedConnector", kv_connector_module_path=__name__)``), so every
connector path of the scheduler runs as it does in a deployment: the
scheduler asks how many tokens beyond its local hit the store holds, blocks
are allocated for them, the load runs synchronously (before the step's
forward pass) or asynchronously (the request waits in
``WAITING_FOR_REMOTE_KVS`` until the worker reports it received), and a load
can fail (the worker reports the blocks it could not fill).

The script is plain data on the connector (:class:`Script`); the scheduler
machine (:mod:`kvspec.conformance.machines.scheduler`) writes it, plays the
worker's part and reads back what was loaded where (:attr:`Load`).  The
worker-side methods are never called: there is no worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)


@dataclass
class Script:
    """What the remote store holds and how loads behave, per request id."""

    remote_tokens: dict[str, int] = field(default_factory=dict)  # prompt tokens the store holds
    async_load: set[str] = field(default_factory=set)
    failing_load: set[str] = field(default_factory=set)  # the load fills none of its blocks


@dataclass
class Load:
    """One load the scheduler asked for: tokens ``[start, start + count)``
    into the request's blocks (per group, as allocated)."""

    request_id: str
    start: int
    count: int
    block_ids: tuple[list[int], ...]
    is_async: bool
    fails: bool


class ScriptedConnector(KVConnectorBase_V1, SupportsHMA):
    """A KV connector (scheduler role) driven by a :class:`Script`."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.script = Script()
        self.loads: list[Load] = []  # allocated since the machine last took them
        self._asked: dict[str, tuple[int, int, bool]] = {}  # request -> (local hit, external, async)
        self.offers: dict[str, list[tuple[int, int, int]]] = {}  # the last step's Mamba-state offers (0.29 on)

    # --- scheduler side ---------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        held = min(self.script.remote_tokens.get(request.request_id, 0), request.num_tokens - 1)
        external = max(0, held - num_computed_tokens)
        is_async = external > 0 and request.request_id in self.script.async_load
        self._asked[request.request_id] = (num_computed_tokens, external, is_async)
        return external, is_async

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        asked = self._asked.pop(request.request_id, None)
        if asked is None or num_external_tokens == 0:
            return  # the second call after an async load: nothing more to load
        local, _, is_async = asked
        self.loads.append(Load(request.request_id, local, num_external_tokens, blocks.get_block_ids(),
                               is_async, request.request_id in self.script.failing_load))

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        # From 0.29 the scheduler hands a connector the Mamba align states cached this step, with their
        # blocks, to save (kv_connector_block_state); kept for whoever drives the scheduler to compare.
        state = getattr(scheduler_output, "kv_connector_block_state", None)
        self.offers = {} if state is None else {rid: list(offers) for rid, offers
                                                 in state.boundary_state_offloads.items()}
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return False, None  # blocks are freed at once: this store does not save

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        return False, None

    def take_loads(self) -> list[Load]:
        loads, self.loads = self.loads, []
        return loads

    # --- worker side: never called (there is no worker) -------------------------

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        raise NotImplementedError("ScriptedConnector has no worker side")

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise NotImplementedError("ScriptedConnector has no worker side")

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        raise NotImplementedError("ScriptedConnector has no worker side")

    def wait_for_save(self) -> None:
        raise NotImplementedError("ScriptedConnector has no worker side")
