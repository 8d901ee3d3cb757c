"""The worker's block tables and slot mappings (models/block_table.py)."""

import pytest
import torch

from kvspec.models.block_table import BlockTable, BlockTables, mamba_state_position


def test_rows_grow_replace_and_clear():
    t = BlockTables([4, 8], max_num_reqs=3, max_model_len=64)
    row = t.add("a", ([5, 6], [9]))
    assert row == 0 and t[0].row(row) == [5, 6] and t[1].row(row) == [9]
    t.append("a", ([7], []))
    assert t[0].row(row) == [5, 6, 7]
    t.append("a", None)  # no new blocks this step
    t.replace("a", ([1], [2]))  # resumed after preemption
    assert t[0].row(row) == [1] and t[1].row(row) == [2]
    assert t.add("b", ([3], [4])) == 1
    t.remove("a")
    assert t[0].tensor[0].abs().sum() == 0
    assert t.add("c", ([8], [8])) == 0  # the lowest free row again


def test_slot_mapping():
    """Token p lives in slot table[p // B] * B + p % B."""
    t = BlockTable(block_size=4, max_num_reqs=2, max_blocks_per_req=4)
    t.add_row([7, 2], 1)
    assert t.slot_mapping([1], [[0, 3, 4, 6]]).tolist() == [28, 31, 8, 10]


def test_kernel_blocks():
    """A manager block of 32 tokens is two kernel blocks of 16: block b is kernel blocks 2b, 2b + 1."""
    t = BlockTable(block_size=32, max_num_reqs=1, max_blocks_per_req=2, kernel_block_size=16)
    t.add_row([3, 5], 0)
    assert t.tensor[0, :4].tolist() == [6, 7, 10, 11]
    assert t.row(0) == [3, 5]
    assert t.slot_mapping([0], [[0, 17, 33]]).tolist() == [96, 113, 161]
    with pytest.raises(ValueError, match="must divide"):
        BlockTable(block_size=24, max_num_reqs=1, max_blocks_per_req=1, kernel_block_size=16)


def test_stale_positions():
    """The worker keeps ids the manager has released (now null there); any other difference is reported."""
    t = BlockTables([2], max_num_reqs=1, max_model_len=16)
    t.add("a", ([4, 5, 6],))
    assert t.stale_positions("a", ([0, 5, 6],)) == []  # block 4 left the window
    assert t.stale_positions("a", ([4, 6, 5],)) == [
        "group 0 position 1: the worker reads block 5, the manager holds block 6",
        "group 0 position 2: the worker reads block 6, the manager holds block 5",
    ]
    assert "holds 3 blocks, the manager 4" in t.stale_positions("a", ([4, 5, 6, 7],))[0]


def test_row_overflow_and_unknown_requests():
    t = BlockTables([2], max_num_reqs=1, max_model_len=4)
    t.add("a", ([1],))
    with pytest.raises(ValueError, match="already has row"):
        t.add("a", ([1],))
    with pytest.raises(ValueError, match="no free row"):
        t.add("b", ([2],))
    with pytest.raises(ValueError, match="room for"):
        t.append("a", (list(range(1, 20)),))


def test_mamba_state_position():
    assert [mamba_state_position(n, 4) for n in (0, 1, 4, 5, 8)] == [-1, 0, 0, 1, 1]


def test_tables_are_int32():
    assert BlockTable(4, 1, 1).tensor.dtype == torch.int32


def test_a_backend_reads_a_manager_block_whole_or_in_its_largest_dividing_size():
    from kvspec.models.architectures import KERNEL_BLOCK_SIZES
    from kvspec.models.block_table import select_kernel_block_size

    assert select_kernel_block_size(1152, KERNEL_BLOCK_SIZES) == 64  # a hybrid's attention block, FlashInfer's sizes
    assert select_kernel_block_size(16, KERNEL_BLOCK_SIZES) == 16
    assert select_kernel_block_size(2, None) == 2  # no backend sizes: read whole
    with pytest.raises(ValueError, match="no kernel block size of \\[16, 32, 64\\] divides the block size 24"):
        select_kernel_block_size(24, KERNEL_BLOCK_SIZES)
