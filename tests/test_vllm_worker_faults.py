"""Faults planted in vLLM's own worker code, in memory, must be caught by the
kernel stage with the target vLLM and no extra flags (``kvspec kernels
--target vllm``): the kernels read vLLM's block tables, vLLM's slot-mapping
kernel places the tokens and vLLM's ``triton_reshape_and_cache_flash``
writes them -- kvspec's model of the worker is only the oracle.

Run under tools/install_vllm.sh's environment:
``PYTHONHASHSEED=0 .venv-vllm/bin/python -m pytest tests/test_vllm_worker_faults.py``.
"""

import pytest

pytest.importorskip("vllm")
pytest.importorskip("triton")

from kvspec.cli import main  # noqa: E402
from kvspec.models.vllm_worker import vllm_worker_available  # noqa: E402

# Each fault is patched into vLLM's modules with monkeypatch: in the test's own process, undone after it.
pytestmark = pytest.mark.skipif(vllm_worker_available() is not None,
                                reason=f"vLLM's worker path cannot run here: {vllm_worker_available()}")

EXAMPLES = "6"


def slot_mapping_offset(monkeypatch):
    """compute_slot_mapping puts every token one slot further on."""
    from vllm.v1.worker import block_table

    compute = block_table.BlockTable.compute_slot_mapping

    def shifted(self, num_reqs, query_start_loc, positions):
        compute(self, num_reqs, query_start_loc, positions)
        self.slot_mapping.gpu[: positions.shape[0]] += 1

    monkeypatch.setattr(block_table.BlockTable, "compute_slot_mapping", shifted)


def cache_write_drops_a_token(monkeypatch):
    """triton_reshape_and_cache_flash skips the last token of every batch."""
    from vllm.v1.attention.ops import triton_reshape_and_cache_flash as module

    write = module.triton_reshape_and_cache_flash

    def dropping(key, value, key_cache, value_cache, slot_mapping, *args, **kwargs):
        if slot_mapping.shape[0] > 1:
            key, value, slot_mapping = key[:-1], value[:-1], slot_mapping[:-1]
        return write(key, value, key_cache, value_cache, slot_mapping, *args, **kwargs)

    monkeypatch.setattr(module, "triton_reshape_and_cache_flash", dropping)


def cache_write_misplaces_a_token(monkeypatch):
    """triton_reshape_and_cache_flash writes the first two tokens' K/V swapped."""
    from vllm.v1.attention.ops import triton_reshape_and_cache_flash as module

    write = module.triton_reshape_and_cache_flash

    def swapping(key, value, key_cache, value_cache, slot_mapping, *args, **kwargs):
        if slot_mapping.shape[0] > 1:
            slot_mapping = slot_mapping.clone()
            slot_mapping[[0, 1]] = slot_mapping[[1, 0]]
        return write(key, value, key_cache, value_cache, slot_mapping, *args, **kwargs)

    monkeypatch.setattr(module, "triton_reshape_and_cache_flash", swapping)


def append_row_drops_a_block(monkeypatch):
    """append_row forgets the last of the new blocks."""
    from vllm.v1.worker import block_table

    append = block_table.BlockTable.append_row

    def forgetful(self, block_ids, row_idx):
        return append(self, list(block_ids)[:-1] if len(block_ids) > 1 else block_ids, row_idx)

    monkeypatch.setattr(block_table.BlockTable, "append_row", forgetful)


def _rewrite(monkeypatch, owner, name: str, old: str, new: str) -> None:
    """Plant a fault in the source of vLLM's function ``owner.name``: the
    text ``old`` becomes ``new``, compiled in the function's own module."""
    import inspect
    import sys
    import textwrap

    function = inspect.unwrap(getattr(owner, name))
    source = textwrap.dedent(inspect.getsource(function))
    assert source.count(old) == 1, f"{name}: the planted line is not in vLLM's source"
    module = sys.modules[function.__module__]
    scope: dict = {}
    exec(compile(source.replace(old, new), inspect.getsourcefile(function), "exec"), vars(module), scope)
    monkeypatch.setattr(owner, name, scope[name])


def kernel_block_split_off_by_one(monkeypatch):
    """map_to_kernel_blocks starts each manager block's kernel blocks one further on."""
    from vllm.v1.worker import block_table

    _rewrite(monkeypatch, block_table.BlockTable, "map_to_kernel_blocks",
             "kv_manager_block_ids.reshape(-1, 1) * blocks_per_kv_block", "kv_manager_block_ids.reshape(-1, 1) * "
             "blocks_per_kv_block + 1")


def resumed_row_not_replaced(monkeypatch):
    """_update_states appends a resumed request's new table to its old one
    instead of replacing it."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _rewrite(monkeypatch, GPUModelRunner, "_update_states", "req_state.block_ids = new_block_ids",
             "req_state.block_ids = tuple(old + new for old, new in zip(req_state.block_ids, new_block_ids))")


def mamba_state_index_one_block_on(monkeypatch):
    """preprocess_mamba keeps the running state one block past the step's last token."""
    from vllm.v1.worker import mamba_utils

    _rewrite(monkeypatch, mamba_utils, "preprocess_mamba", "curr_state_idx = num_blocks - 1 - num_speculative_blocks",
             "curr_state_idx = num_blocks - num_speculative_blocks")


def mamba_last_block_one_on(monkeypatch):
    """The Mamba metadata builder (all mode) puts the last scheduled token one block further on."""
    from vllm.v1.attention.backends.mamba_attn import BaseMambaAttentionMetadataBuilder

    _rewrite(monkeypatch, BaseMambaAttentionMetadataBuilder, "_compute_prefix_caching_block_indices",
             "cdiv(common_attn_metadata.seq_lens, mamba_block_size) - 1",
             "cdiv(common_attn_metadata.seq_lens, mamba_block_size)")


def mamba_kernel_block_one_back(monkeypatch):
    """mamba_get_block_table_tensor points the kernel one block before the last token's."""
    from vllm.v1.attention.backends import utils

    _rewrite(monkeypatch, utils, "mamba_get_block_table_tensor", "(seq_lens - 1) // kv_cache_spec.block_size",
             "(seq_lens - 1) // kv_cache_spec.block_size - 1")


def layers_share_a_tensor(monkeypatch):
    """get_kv_cache_config_from_groups binds every tensor to each group's first layer."""
    from vllm.v1.core import kv_cache_utils

    _rewrite(monkeypatch, kv_cache_utils, "get_kv_cache_config_from_groups",
             "shared_by.append(kv_cache_groups[j].layer_names[i])",
             "shared_by.append(kv_cache_groups[j].layer_names[0])")


def tensors_one_page_short(monkeypatch):
    """get_kv_cache_config_from_groups sizes each tensor one page short of the pool."""
    from vllm.v1.core import kv_cache_utils

    _rewrite(monkeypatch, kv_cache_utils, "get_kv_cache_config_from_groups",
             "KVCacheTensor(size=page_size * num_blocks, shared_by=shared_by)",
             "KVCacheTensor(size=page_size * (num_blocks - 1), shared_by=shared_by)")


# --- Model Runner V2 (vllm/v1/worker/gpu/), the runner vLLM picks for dense models like Llama-3 ---------


def v2_staged_write_one_on(monkeypatch):
    """BlockTables.append_block_ids stages a new request's table one entry further on."""
    from vllm.v1.worker.gpu import block_table

    _rewrite(monkeypatch, block_table.BlockTables, "append_block_ids",
             "if not overwrite else 0", "if not overwrite else 1")


def v2_gather_drops_last_block(monkeypatch):
    """BlockTables.gather_block_tables copies one block fewer of every row into the batch's tables."""
    from vllm.v1.worker.gpu import block_table

    _rewrite(monkeypatch, block_table.BlockTables, "gather_block_tables", "self.num_blocks.gpu,",
             "(self.num_blocks.gpu - 1).clamp(min=0),")


def v2_slot_mapping_one_on(monkeypatch):
    """BlockTables.compute_slot_mappings places every token at the next position's slot."""
    from vllm.v1.worker.gpu import block_table

    _rewrite(monkeypatch, block_table.BlockTables, "compute_slot_mappings", "    positions,\n",
             "    positions + 1,\n")


def v2_new_request_one_token_on(monkeypatch):
    """add_requests records a new request's computed tokens one too many (its request state)."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    _rewrite(monkeypatch, GPUModelRunner, "add_requests", "num_computed_tokens=new_req_data.num_computed_tokens,",
             "num_computed_tokens=new_req_data.num_computed_tokens + 1,")


def v2_rejected_drafts_kept(monkeypatch):
    """postprocess_sampled advances the computed tokens over rejected drafts too."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    _rewrite(monkeypatch, GPUModelRunner, "postprocess_sampled", "num_rejected,\n", "num_rejected * 0,\n")


def v2_window_nulls_a_block_too_many(monkeypatch):
    """gather_block_tables (0.34.0) nulls one block more below a sliding window than no query can read."""
    import inspect

    from vllm.v1.worker.gpu import block_table

    if "sliding_window_reach" not in inspect.signature(block_table.BlockTables).parameters:
        raise AttributeError("this release's BlockTables.gather_block_tables masks no sliding window")
    _rewrite(monkeypatch, block_table.BlockTables, "gather_block_tables", "self.sliding_window_reach,\n",
             "self.sliding_window_reach - self.block_sizes_tensor,\n")


FAULTS = {
    slot_mapping_offset: {"vllm-block-table", "slot-ownership", "exact-gather"},
    cache_write_drops_a_token: {"exact-gather"},
    cache_write_misplaces_a_token: {"exact-gather"},
    append_row_drops_a_block: {"vllm-block-table", "exact-gather"},
    kernel_block_split_off_by_one: {"vllm-block-table", "slot-ownership", "exact-gather"},
    resumed_row_not_replaced: {"vllm-block-table"},
    mamba_state_index_one_block_on: {"vllm-block-table", "mamba-state"},
    mamba_kernel_block_one_back: {"vllm-block-table", "mamba-state"},
    mamba_last_block_one_on: {"vllm-block-table", "mamba-state"},
    layers_share_a_tensor: {"cache-layout"},
    tensors_one_page_short: {"cache-layout"},
    v2_staged_write_one_on: {"vllm-block-table", "exact-gather"},
    v2_gather_drops_last_block: {"vllm-block-table", "exact-gather"},
    v2_slot_mapping_one_on: {"vllm-block-table", "slot-ownership", "exact-gather"},
    v2_new_request_one_token_on: {"vllm-block-table"},
    v2_rejected_drafts_kept: {"vllm-block-table"},
    v2_window_nulls_a_block_too_many: {"vllm-block-table", "exact-gather"},
}
V2_FAULTS = {v2_staged_write_one_on, v2_gather_drops_last_block, v2_slot_mapping_one_on, v2_new_request_one_token_on,
             v2_rejected_drafts_kept, v2_window_nulls_a_block_too_many}
# Align mode's state copies run on the manager layout with an align-mode Mamba group; all mode's metadata on
# Nemotron-H (vLLM's "all" for it).
MODEL = {kernel_block_split_off_by_one: "nemotron-h-8b@small",  # 1152-token blocks as 64-token kernel blocks
         mamba_state_index_one_block_on: "full+mamba-align", mamba_kernel_block_one_back: "full+mamba-align",
         mamba_last_block_one_on: "nemotron-h-8b", layers_share_a_tensor: "nemotron-h-8b",
         v2_window_nulls_a_block_too_many: "mistral-7b"}  # sliding-window attention in every layer


# Model Runner V1's own faults on a model vLLM serves with V1 (gpt-oss: MoE); V2's and the shared cache write's
# on Llama-3, which vLLM serves with V2.
V1_MODEL = "gpt-oss"
MODEL.update({f: V1_MODEL for f in (slot_mapping_offset, append_row_drops_a_block, resumed_row_not_replaced)})


def _plant(plant, monkeypatch) -> None:
    """Plant the fault, or skip where the installed release has no such code (0.34.0 removed Model Runner V1's
    modules, and moved the KV-cache tensor plan to kv_cache_planning)."""
    try:
        plant(monkeypatch)
    except (ImportError, AttributeError) as error:
        pytest.skip(f"{plant.__name__}: the faulted code is not in this vLLM release ({type(error).__name__}: "
                    f"{error})")


def _skip_if_its_runner_cannot_run(code: int, out: str) -> None:
    """A layout whose model runner cannot run here is skipped, with the reason (exit 2 when none ran)."""
    skipped = [line for line in out.splitlines() if "skipped (runner " in line]
    if code == 2 and skipped:
        pytest.skip(skipped[0].split("skipped (", 1)[1].removesuffix(")"))


@pytest.mark.parametrize("plant", FAULTS, ids=lambda f: f.__name__)
def test_a_fault_in_vllms_worker_is_caught_by_default(plant, monkeypatch, capsys):
    _plant(plant, monkeypatch)
    model, _, scale = MODEL.get(plant, "llama-3-8b").partition("@")
    code = main(["kernels", "--target", "vllm", "--model", model, "--scale", scale or "tiny", "--examples", EXAMPLES,
                 "--seed", "1"])
    out = capsys.readouterr().out
    _skip_if_its_runner_cannot_run(code, out)
    assert code == 1, out
    assert "worker=vllm" in out
    runner = "Model Runner V2" if plant in V2_FAULTS else None
    if runner:
        assert f"driven: {runner}" in out, out
    failed = [line for line in out.splitlines() if "KernelStageError" in line]
    assert failed and any(check in failed[0] for check in FAULTS[plant]), out


@pytest.mark.parametrize("model", ["llama-3-8b", V1_MODEL])
def test_vllms_worker_unbroken_passes(model, capsys):
    from kvspec.models.architectures import ARCHITECTURES
    from kvspec.models.vllm_runner_choice import RUNNER_NAMES, vllm_runner_choice

    code = main(["kernels", "--target", "vllm", "--model", model, "--examples", EXAMPLES, "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "worker=vllm" in out
    # vLLM's choice: on 0.25.1 V2 for Llama-3, V1 for gpt-oss (MoE); 0.34.0 has V2 alone.
    assert f"driven: {RUNNER_NAMES[vllm_runner_choice(ARCHITECTURES[model]).picked]}" in out, out


def test_kvspecs_worker_does_not_see_vllms(monkeypatch, capsys):
    """The other side of the principle: with kvspec's model of the worker, a
    fault in vLLM's worker code is never exercised -- which is why vLLM's is
    the default for the target vllm."""
    _plant(slot_mapping_offset, monkeypatch)
    # The worker is the question here, not the kernels: reference and flex only (with vLLM's interpreted
    # kernels, the default for the target vllm, this test took 173 s on 2 cores shared at load 8.5).
    code = main(["kernels", "--target", "vllm", "--worker", "kvspec", "--kernels", "reference,flex", "--model",
                 V1_MODEL, "--examples", "5", "--seed", "1"])
    assert code == 0, capsys.readouterr().out
