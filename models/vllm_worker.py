"""vLLM's own worker path in the kernel stage: the block tables the kernels
read, the slot mapping and the cache writes, as vLLM's model runner does them.

When the target is vLLM, the test is of vLLM as it runs, not of kvspec's
model of its worker.  So the :class:`~kvspec.models.runner.Engine` hands the
worker's jobs to vLLM's code:

- **block tables**: vLLM's ``MultiGroupBlockTable`` (``vllm/v1/worker/block_table.py``)
  gets every row update -- ``add_row`` for a request joining the batch or
  resuming, ``append_row`` with each step's new blocks, ``clear_row`` when it
  leaves -- including its own split of manager blocks into kernel blocks;
  ``commit_block_table`` copies the rows to the device tensor, and *that*
  tensor is what every attention kernel (and the Mamba step) reads;
- **slot mapping**: vLLM's Triton ``_compute_slot_mapping_kernel`` (via
  ``compute_slot_mapping``) over the step's tokens, in vLLM's row order;
- **cache writes**: vLLM's ``triton_reshape_and_cache_flash`` writes every
  scheduled token's K and V through that slot mapping (attention groups; an
  MLA group's latent is written by kvspec: vLLM's ``concat_and_cache_mla`` is
  a CUDA op).

kvspec's own tables (:class:`~kvspec.models.block_table.BlockTables`) are
fed the same updates and stay the oracle: the ``vllm-block-table`` check
compares vLLM's rows and slot mapping with them every step, and the other
checks (exact-gather, slot-ownership, mamba-state) judge what vLLM's tables
made the kernels read.  On a CPU, vLLM's Triton kernels run under Triton's
interpreter (``TRITON_INTERPRET=1``, set before Triton is imported).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from unittest import mock

import torch

from kvspec.models.block_table import manager_block_ids
from kvspec.models.kernels import triton_cannot_run

if TYPE_CHECKING:
    from kvspec.models.runner import Engine, Group, Work


def vllm_worker_available() -> str | None:
    """None when vLLM's worker path can run here, else why not (an
    environment problem, never the target's failure)."""
    try:
        import triton  # noqa: F401
        from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash  # noqa: F401
        from vllm.v1.worker.block_table import MultiGroupBlockTable  # noqa: F401
    except Exception as error:  # ImportError, or vLLM's Triton probe refusing
        return f"vLLM's worker modules do not import ({type(error).__name__}: {error})"
    return triton_cannot_run()


@contextlib.contextmanager
def _on_cpu(device: torch.device) -> Iterator[None]:
    """vLLM's kernel launchers ask the CUDA device for its compute capability
    to pick tile sizes; a CPU tensor has none.  Under Triton's interpreter
    the answer only sizes the tiles, so the launcher is told a Hopper's."""
    if device.type == "cuda":
        yield
        return
    with mock.patch("torch.cuda.get_device_capability", return_value=(9, 0)):
        yield


class VllmWorker:
    """vLLM's worker-side block tables, slot mapping and cache writes for one
    engine (see the module docstring).  Rows are the engine's: a request
    keeps the row kvspec's tables gave it."""

    def __init__(self, engine: Engine):
        from vllm.v1.worker.block_table import MultiGroupBlockTable

        problem = vllm_worker_available()
        if problem is not None:
            raise RuntimeError(problem)
        self.engine = engine
        self.device = torch.device(engine.device)
        self.max_num_reqs = engine.max_num_reqs
        self.max_num_batched_tokens = 4 * engine.layout.max_model_len
        self.table = MultiGroupBlockTable(
            max_num_reqs=self.max_num_reqs, max_model_len=engine.layout.max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens, pin_memory=False, device=self.device,
            block_sizes=[g.block_size for g in engine.groups],
            kernel_block_sizes=[g.kernel_block_size for g in engine.groups])
        self._slots: dict[int, tuple[int, int]] = {}  # row -> [start, end) in this step's slot mapping
        self._num_rows = 0

    # --- what the scheduler tells the worker --------------------------------------------------------------

    def add(self, row: int, ids: Sequence[Sequence[int]]) -> None:
        self.table.add_row(tuple(list(i) for i in ids), row)

    def append(self, row: int, ids: Sequence[Sequence[int]] | None) -> None:
        if ids is not None:
            self.table.append_row(tuple(list(i) for i in ids), row)

    def remove(self, row: int) -> None:
        self.table.clear_row(row)

    # --- a step --------------------------------------------------------------------------------------------

    def prepare(self, work: Sequence[Work]) -> None:
        """Before the kernels run: copy the rows to the device tensor and
        compute the slot mapping of every scheduled token, rows in order (an
        unscheduled row gets no tokens), as vLLM's model runner does."""
        rows = {self.engine.tables.row_of(w.request.request_id): w for w in work}
        self._num_rows = max(rows, default=-1) + 1
        lens = [0] * self._num_rows
        for row, w in rows.items():
            lens[row] = w.end - w.start
        starts = [0, *itertools.accumulate(lens)]
        self._slots = {row: (starts[row], starts[row + 1]) for row in rows}
        positions = [p for row in sorted(rows) for p in range(rows[row].start, rows[row].end)]
        if len(positions) > self.max_num_batched_tokens:
            raise ValueError(f"a step of {len(positions)} tokens; the worker was sized for "
                             f"{self.max_num_batched_tokens}")
        self.table.commit_block_table(self._num_rows)
        if positions:
            self.table.compute_slot_mapping(self._num_rows, torch.tensor(starts, dtype=torch.int32,
                                                                         device=self.device),
                                            torch.tensor(positions, dtype=torch.int64, device=self.device))

    def block_table(self, group: int) -> torch.Tensor:
        """The device tensor the kernels read (rows 0..n-1 of this step)."""
        return self.table[group].get_device_tensor(self._num_rows)

    def row(self, group: int, row: int) -> list[int]:
        """The manager-sized block ids of ``row`` in vLLM's table (for Mamba
        rows, which vLLM never splits into kernel blocks)."""
        table = self.table[group]
        n = int(table.num_blocks_per_row[row])
        return manager_block_ids(table.get_cpu_tensor()[row, :n].tolist(), table.blocks_per_kv_block)

    def slot_mapping(self, group: int, row: int) -> torch.Tensor:
        """The slots vLLM computed for ``row``'s tokens this step (int64)."""
        start, end = self._slots[row]
        return self.table[group].slot_mapping.gpu[start:end].to("cpu", torch.int64)

    def write_kv(self, group: Group, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                 value_cache: torch.Tensor, slots: torch.Tensor) -> None:
        """vLLM's ``triton_reshape_and_cache_flash``: token ``i``'s K and V
        into slot ``slots[i]`` of the group's caches."""
        from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash

        one = torch.ones((), dtype=torch.float32, device=self.device)
        with _on_cpu(self.device):
            triton_reshape_and_cache_flash(key.to(self.device).contiguous(), value.to(self.device).contiguous(),
                                           key_cache, value_cache, slots.to(self.device), "auto", one, one)

    # --- the oracle ------------------------------------------------------------------------------------------

    def compare(self, work: Sequence[Work], check: Any) -> None:
        """vLLM's rows and slot mapping against kvspec's tables (the
        ``vllm-block-table`` check); ``check(message)`` reports a difference."""
        ours_tables = self.engine.tables
        rows = sorted(ours_tables.row_of(w.request.request_id) for w in work)
        for g, group in enumerate(self.engine.groups):
            ours, theirs = ours_tables[g], self.table[g]
            for row in rows:
                n = ours.num_blocks[row]
                held = theirs.get_cpu_tensor()[row, :int(theirs.num_blocks_per_row[row])]
                if int(theirs.num_blocks_per_row[row]) != n or not torch.equal(held.to(ours.tensor.device),
                                                                              ours.tensor[row, :n]):
                    check(f"group {g} row {row}: vLLM's table holds {held.tolist()}, kvspec's "
                          f"{ours.tensor[row, :n].tolist()}")
                    return
            if group.kind not in ("attention", "mla"):
                continue
            for w in work:
                row = ours_tables.row_of(w.request.request_id)
                want = ours.slot_mapping([row], [list(range(w.start, w.end))])
                got = self.slot_mapping(g, row)
                if not torch.equal(got, want):
                    check(f"group {g} row {row}: vLLM's slot mapping {got.tolist()}, kvspec's {want.tolist()}")
                    return
