"""The tensors a kernel reads: block tables and slot mappings, per KV-cache group.

The manager answers in block ids; the worker keeps them in one int32 tensor
per group, a row per request (vLLM's ``vllm/v1/worker/block_table.py``):

- a **new** request's row is the whole table the manager holds for it (hits,
  null placeholders for blocks a window skipped, new blocks);
- a **running** request's row grows by the new blocks each ``allocate_slots``
  returns (the worker is never told when the manager releases a block that
  left the window: the row keeps the old id, and the kernel must never read
  it -- the attention window masks it);
- a **resumed** (preempted, re-admitted) request's row is replaced whole;
- a finished request's row is cleared.

So at every position a row holds either what the manager's table holds or a
block the manager has since released (where it now holds the null block 0).
:meth:`BlockTables.stale_positions` names the positions where that is not so.

The **slot** of token ``p`` of a request in a group of block size ``B`` is
``table[p // B] * B + p % B``: the cache row where its key and value live.
When the attention kernel's block size ``b`` is smaller than the manager's
(``B = k * b``, as for hybrid Mamba models, whose attention blocks are large),
each manager block ``i`` is ``k`` kernel blocks ``i*k .. i*k + k - 1`` and the
table holds kernel block ids.

A **Mamba** group's row holds state blocks: the state after ``n`` tokens
lives at position ``cdiv(n, B) - 1`` (see :func:`mamba_state_position`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvspec.kv_cache_interface import cdiv

NULL_BLOCK = 0
PAD_SLOT = -1  # vLLM's PAD_SLOT_ID: padding tokens write nowhere


def manager_block_ids(kernel_block_ids: Sequence[int], blocks_per_manager_block: int) -> list[int]:
    """A row of kernel block ids back as the manager's block ids: each
    ``blocks_per_manager_block`` consecutive kernel blocks are one of its blocks."""
    k = blocks_per_manager_block
    return [b // k for b in kernel_block_ids[::k]]


class BlockTable:
    """One group's block table: ``tensor[row, i]`` is the ``i``-th (kernel)
    block of the request in ``row``; ``num_blocks[row]`` how many are set."""

    def __init__(self, block_size: int, max_num_reqs: int, max_blocks_per_req: int,
                 kernel_block_size: int | None = None, device: str | torch.device = "cpu"):
        kernel_block_size = kernel_block_size or block_size
        if block_size % kernel_block_size:
            raise ValueError(f"kernel block size {kernel_block_size} must divide the block size {block_size}")
        self.block_size = kernel_block_size
        self.manager_block_size = block_size
        self.blocks_per_manager_block = block_size // kernel_block_size
        width = max_blocks_per_req * self.blocks_per_manager_block
        self.tensor = torch.zeros(max_num_reqs, width, dtype=torch.int32, device=device)
        self.num_blocks = [0] * max_num_reqs

    def kernel_blocks(self, block_ids: Sequence[int]) -> list[int]:
        """Manager block ids as kernel block ids (each ``k`` in a row)."""
        k = self.blocks_per_manager_block
        return list(block_ids) if k == 1 else [b * k + j for b in block_ids for j in range(k)]

    def append_row(self, block_ids: Sequence[int], row: int) -> None:
        ids = self.kernel_blocks(block_ids)
        if not ids:
            return
        start = self.num_blocks[row]
        if start + len(ids) > self.tensor.shape[1]:
            raise ValueError(f"row {row} would hold {start + len(ids)} blocks; the table has room for "
                             f"{self.tensor.shape[1]}")
        self.tensor[row, start:start + len(ids)] = torch.tensor(ids, dtype=torch.int32)
        self.num_blocks[row] = start + len(ids)

    def add_row(self, block_ids: Sequence[int], row: int) -> None:
        self.clear_row(row)
        self.append_row(block_ids, row)

    def clear_row(self, row: int) -> None:
        self.tensor[row, : self.num_blocks[row]] = 0
        self.num_blocks[row] = 0

    def row(self, row: int) -> list[int]:
        """The manager-sized block ids the row holds."""
        return manager_block_ids(self.tensor[row, : self.num_blocks[row]].tolist(), self.blocks_per_manager_block)

    def slot_mapping(self, rows: Sequence[int], positions: Sequence[Sequence[int]]) -> torch.Tensor:
        """The cache slot of each position of each row, concatenated (int64)."""
        bs = self.block_size
        rows_t = torch.tensor([r for r, pos in zip(rows, positions, strict=True) for _ in pos], dtype=torch.long)
        pos_t = torch.tensor([p for pos in positions for p in pos], dtype=torch.long)
        if not len(pos_t):
            return torch.zeros(0, dtype=torch.long)
        blocks = self.tensor[rows_t.to(self.tensor.device), (pos_t // bs).to(self.tensor.device)].long().cpu()
        return blocks * bs + pos_t % bs


class BlockTables:
    """Every group's table, rows assigned to requests as they join the batch.

    ``add`` / ``append`` / ``replace`` / ``remove`` follow what vLLM's
    scheduler tells its workers (see the module docstring)."""

    def __init__(self, block_sizes: Sequence[int], max_num_reqs: int, max_model_len: int,
                 kernel_block_sizes: Sequence[int | None] | None = None, device: str | torch.device = "cpu"):
        kernel_block_sizes = kernel_block_sizes or [None] * len(block_sizes)
        self.groups = [
            BlockTable(bs, max_num_reqs, cdiv(max_model_len, bs) + 8, kbs, device)
            for bs, kbs in zip(block_sizes, kernel_block_sizes, strict=True)
        ]
        self.rows: dict[str, int] = {}
        self._free_rows = list(range(max_num_reqs))

    def __getitem__(self, group: int) -> BlockTable:
        return self.groups[group]

    def row_of(self, request_id: str) -> int:
        return self.rows[request_id]

    def add(self, request_id: str, block_ids: Sequence[Sequence[int]]) -> int:
        """A request joins the batch with its whole table; returns its row."""
        if request_id in self.rows:
            raise ValueError(f"request {request_id!r} already has row {self.rows[request_id]}")
        if not self._free_rows:
            raise ValueError("no free row in the block tables")
        row = self._free_rows.pop(0)
        self.rows[request_id] = row
        for table, ids in zip(self.groups, block_ids, strict=True):
            table.add_row(ids, row)
        return row

    def append(self, request_id: str, new_block_ids: Sequence[Sequence[int]] | None) -> None:
        """A running request's new blocks (``allocate_slots``' answer)."""
        if new_block_ids is None:
            return
        row = self.rows[request_id]
        for table, ids in zip(self.groups, new_block_ids, strict=True):
            table.append_row(ids, row)

    def replace(self, request_id: str, block_ids: Sequence[Sequence[int]]) -> None:
        """A resumed request's whole table."""
        row = self.rows[request_id]
        for table, ids in zip(self.groups, block_ids, strict=True):
            table.add_row(ids, row)

    def remove(self, request_id: str) -> None:
        row = self.rows.pop(request_id)
        for table in self.groups:
            table.clear_row(row)
        self._free_rows.append(row)
        self._free_rows.sort()

    def stale_positions(self, request_id: str, manager_ids: Sequence[Sequence[int]]) -> list[str]:
        """Where the worker's row disagrees with the manager's table other
        than at blocks the manager released since (it holds null there)."""
        problems = []
        row = self.rows[request_id]
        for g, (table, ids) in enumerate(zip(self.groups, manager_ids, strict=True)):
            have = table.row(row)
            if len(have) != len(ids):
                problems.append(f"group {g}: the worker's row holds {len(have)} blocks, the manager {len(ids)}")
                continue
            for i, (worker, manager) in enumerate(zip(have, ids, strict=True)):
                if worker != manager and manager != NULL_BLOCK:
                    problems.append(f"group {g} position {i}: the worker reads block {worker}, "
                                    f"the manager holds block {manager}")
        return problems


def mamba_state_position(num_tokens: int, block_size: int) -> int:
    """Where the state after ``num_tokens`` tokens lives in a Mamba row (-1:
    no tokens, no state)."""
    return cdiv(num_tokens, block_size) - 1


def select_kernel_block_size(block_size: int, supported: Sequence[int] | None) -> int:
    """The kernel block size an attention backend reads a manager block of
    ``block_size`` tokens in: the block itself when the backend supports
    its size, else the largest supported size that divides it (as vLLM's
    ``select_common_block_size`` chooses among a backend's fixed sizes).
    ``supported`` None: the block is read whole."""
    if supported is None or block_size in supported:
        return block_size
    for size in sorted(supported, reverse=True):
        if block_size % size == 0:
            return size
    raise ValueError(f"no kernel block size of {sorted(supported)} divides the block size {block_size}")
