"""The request as the KV-cache manager sees it.

Shaped like vLLM 0.25.1's ``vllm.v1.request.Request`` for the fields the
block manager reads: ids, tokens, how many are computed, the block hashes
(kept current by a block hasher as tokens are appended), and the extra keys
(cache salt, LoRA, multimodal features).  Scheduling fields that only the
scheduler reads (sampling parameters, priority, events) are accepted and
kept, not interpreted.  Shared by :mod:`kvspec.spec` and :mod:`kvspec.impl`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED


@dataclass(frozen=True)
class LoRARequest:
    """A LoRA adapter: its name is part of every block hash of the request."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name


@dataclass(frozen=True)
class PlaceholderRange:
    offset: int
    length: int


@dataclass(frozen=True)
class MultiModalFeatureSpec:
    """Where a multimodal input sits in the prompt and what names it."""

    identifier: str
    mm_position: PlaceholderRange


class Request:
    """A request's tokens and cache identity.

    ``block_hashes`` holds one hash per full ``hash_block_size`` block of
    ``all_token_ids`` when a ``block_hasher`` is given (see
    :func:`kvspec.hashing.get_request_block_hasher`), extended on every
    :meth:`append_output_token_ids`.

    A prompt may come as embeddings (``prompt_embeds``: one row per token --
    a torch tensor, a numpy array, or a list of ``bytes`` rows); its token
    ids are then placeholders (zeros when ``prompt_token_ids`` is ``None``)
    and the embeddings' bytes are part of every block hash.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | None,
        sampling_params: Any = None,
        pooling_params: Any = None,
        *,
        mm_features: list[MultiModalFeatureSpec] | None = None,
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
        block_hasher: Callable[[Request], list[bytes]] | None = None,
        skip_reading_prefix_cache: bool = False,
        prompt_embeds: Any = None,
        **ignored: Any,
    ) -> None:
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {request_id!r}")
        if prompt_token_ids is None:
            if prompt_embeds is None:
                raise ValueError("a request needs prompt_token_ids or prompt_embeds")
            prompt_token_ids = [0] * len(prompt_embeds)
        elif prompt_embeds is not None and len(prompt_embeds) != len(prompt_token_ids):
            raise ValueError(f"{len(prompt_token_ids)} prompt token ids but {len(prompt_embeds)} prompt embeddings")
        prompt_token_ids = list(prompt_token_ids)
        # One pass in C over the types (a 32k-token prompt: 0.3 ms; a generator's any(): 0.7); bools are refused too.
        if list(map(type, prompt_token_ids)).count(int) != len(prompt_token_ids):
            bad = next(t for t in prompt_token_ids if type(t) is not int)
            raise TypeError(f"prompt_token_ids must be ints, got {bad!r} ({type(bad).__name__})")
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.pooling_params = pooling_params
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.mm_features = list(mm_features or [])
        self.prompt_token_ids = prompt_token_ids
        self.prompt_embeds = prompt_embeds
        self._prompt_embeds_per_block_hashes: dict[tuple[int, int], bytes] = {}
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._all_token_ids = prompt_token_ids.copy()
        self._output_token_ids: list[int] = []
        self.spec_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.skip_reading_prefix_cache = skip_reading_prefix_cache
        self.block_hashes: list[bytes] = []
        self._block_hasher = block_hasher
        self.update_block_hashes()

    @property
    def all_token_ids(self) -> Sequence[int]:
        return self._all_token_ids

    @property
    def output_token_ids(self) -> Sequence[int]:
        return self._output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        new = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        self._output_token_ids.extend(new)
        self._all_token_ids.extend(new)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, status={self.status.name})"
        )
