"""The live model: one torch model, every role a plan over memory-mapped checkpoints."""
from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.merge.live import LiveModel, MappedCheckpoint, live_dtype
from layerswap_core.merge.executor import merge_to_folder
from layerswap_core.checkpoints.loading import load_model
from layerswap_core.merge.config import MergeConfig

CONFIGS = {
    "layer swap": MergeConfig(bottom=2, top=1),
    "transitions": MergeConfig(bottom=2, top=1, transition_bottom=1, transition_top=1,
                               w_task=0.7, w_lang=0.3),
    "magnitude blend": MergeConfig(bottom=1, top=1, transition_bottom=2, magnitude_weights=True),
    "partition A": MergeConfig(partition="A", scale_partition=True),
    "soup": MergeConfig(method="soup"),
    "magnitude soup": MergeConfig(method="magnitude_soup"),
    "task arithmetic": MergeConfig(method="task_arithmetic", lambda_task=0.8, lambda_lang=0.6),
    "ties": MergeConfig(method="ties", ties_density=0.5),
}


@pytest.fixture(scope="module")
def live(tiny, one_thread):
    return LiveModel.from_refs(tiny["task"], tiny["lang"], tiny["base"])


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _address_range(mm) -> tuple[int, int]:
    start = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    return start, start + len(mm)


def _in_a_mapped_checkpoint(t: torch.Tensor) -> bool:
    """Whether a tensor's data lies in a memory mapping of a *.safetensors file (Linux)."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5].endswith(".safetensors"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= t.data_ptr() < hi:
                    return True
    return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps")
def test_the_live_model_owns_its_parameters_from_the_start(tiny, one_thread):
    """transformers leaves a float32 checkpoint's parameters on a private mapping of the file
    (the first rewrite then paid a copy-on-write fault per page); the live model reads them once
    into its own memory at open, and a role switch reads the tensors straight into that memory
    without mapping the source file."""
    direct, _ = load_model(tiny["task"])
    assert any(_in_a_mapped_checkpoint(p) for p in direct.parameters())  # the detector works
    live = LiveModel.from_refs(tiny["task"], tiny["lang"], tiny["base"])
    assert not any(_in_a_mapped_checkpoint(p) for p in live.model.parameters())
    assert live.opened.rewritten == live.opened.total == len(live.names)
    bf16 = LiveModel.from_refs(tiny["task"], tiny["lang"], tiny["base"], dtype=torch.bfloat16)
    assert bf16.opened.rewritten == 0  # converted from float32 by transformers: private already
    assert not any(_in_a_mapped_checkpoint(p) for p in bf16.model.parameters())
    for n, p in live.model.named_parameters():
        assert torch.equal(p, dict(direct.named_parameters())[n]), n
    ptrs = {n: p.data_ptr() for n, p in live.model.named_parameters()}
    for role in ("lang", "base", "task"):
        assert live.show(role).rewritten > 0
        assert not live.sources[role].reader._maps  # read with plain reads, nothing mapped
    assert {n: p.data_ptr() for n, p in live.model.named_parameters()} == ptrs
    assert not any(_in_a_mapped_checkpoint(p) for p in live.model.parameters())


def test_mapped_tensors_are_views_of_the_file_not_copies(tiny):
    reader = CheckpointReader(tiny["lang"])
    mapped = MappedCheckpoint(reader)
    for name in reader.names():
        view = mapped[name]
        assert torch.equal(view, reader.read(name))
        loc = reader.location(name)
        lo, hi = _address_range(mapped.reader._maps[loc.path])
        assert lo <= view.data_ptr() and view.data_ptr() + loc.nbytes <= hi, name
    mapped.release()  # advising the pages away keeps the views valid (read again on touch)
    assert torch.equal(mapped[reader.names()[0]], reader.read(reader.names()[0]))


def test_showing_roles_and_merges_allocates_no_new_parameter_memory(live):
    """The live model's parameters are rewritten in place: the same storages, whatever is shown,
    so private memory does not grow with the number of roles."""
    ptrs = {n: p.data_ptr() for n, p in live.model.named_parameters()}
    size = live.resident_bytes()
    for what in ("base", "lang", CONFIGS["transitions"], "task", CONFIGS["ties"], "base"):
        live.show(what)
        assert {n: p.data_ptr() for n, p in live.model.named_parameters()} == ptrs
        assert live.resident_bytes() == size
    # the only tensors the live model keeps are views into the mapped files
    for src in live.sources.values():
        assert not hasattr(src, "_cache")
        assert set(src.reader._maps) <= {src.reader.location(n).path for n in src.names}


@pytest.mark.parametrize("role", ["base", "task", "lang"])
def test_each_role_is_that_checkpoint_bit_for_bit_and_generates_the_same(live, tiny, role):
    live.show(role)
    direct, tok = load_model(tiny[role])
    want = dict(direct.named_parameters())
    for n, p in live.model.named_parameters():
        assert torch.equal(p, want[n]), n
    prompts = ["Juma ana maembe 12.", "2 + 3 ="]
    for text in prompts:
        ids = tok(text, return_tensors="pt")
        a = live.model.generate(**ids, max_new_tokens=6, do_sample=False)
        b = direct.generate(**ids, max_new_tokens=6, do_sample=False)
        assert a.tolist() == b.tolist()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_x_then_y_equals_y_directly_for_every_method(live, tiny, name):
    y = CONFIGS[name]
    live.show(CONFIGS["transitions"] if name != "transitions" else CONFIGS["soup"])
    live.show("lang")
    live.show(y)
    fresh = LiveModel.from_refs(tiny["task"], tiny["lang"], tiny["base"])
    fresh.show(y)
    got, want = _params(live.model), _params(fresh.model)
    for n in want:
        assert torch.equal(got[n], want[n]), (name, n)


def test_live_merge_equals_the_streamed_merge_on_disk(live, tiny, tmp_path):
    from dataclasses import replace
    cfg = replace(CONFIGS["transitions"], dtype="float32")
    out = merge_to_folder(cfg, tiny["task"], tiny["lang"], tiny["base"], tmp_path / "m")
    live.show(cfg)
    disk = CheckpointReader(out)
    for n, p in live.model.named_parameters():
        assert torch.equal(p, disk.read(n)), n


def test_switching_rewrites_only_changed_tensors(live):
    live.show("task")
    swap = live.show(CONFIGS["layer swap"])
    not_from_task = {n for n, s in live.plan.sources.items() if s.model != "task"}
    assert swap.rewritten == len(not_from_task) > 0
    again = live.show(CONFIGS["layer swap"])
    assert again.rewritten == 0
    back = live.show("task")
    assert back.rewritten == swap.rewritten


def test_dtype_policy(tiny):
    reader = CheckpointReader(tiny["task"])
    assert live_dtype(reader, "cpu") == torch.float32  # small model on CPU


def test_non_finite_merge_is_refused_and_the_next_plan_rewrites_everything(live):
    """A plan whose arithmetic overflows (weights no config would allow, set on the plan itself)
    is refused with the tensor named; the model is then in an unknown state, so the next plan
    rewrites every parameter."""
    from layerswap_core.merge.live import role_plan
    from layerswap_core.merge.registry import Source

    plan = role_plan("task", live.names, live.arch)
    name = next(n for n in live.names if ".layers.3." in n and n.endswith("proj.weight"))
    plan.sources[name] = Source("task_arithmetic", ("base", "task", "lang"), (1e39, 1e39))
    with pytest.raises(ValueError, match="non-finite"):
        live.apply_plan(plan)
    assert live.plan is None
    res = live.show("task")
    assert res.rewritten == res.total


@pytest.mark.parametrize("name", ["transitions", "ties"])
def test_large_blends_are_computed_in_row_blocks_with_the_same_result(live, tiny, monkeypatch,
                                                                      name):
    """Blocks bound the float32 temporaries of a blended embedding; the result is the same
    bit for bit as one whole-tensor computation (TIES too: its trim threshold is taken over the
    whole tensor before the blocks)."""
    from layerswap_core.merge import apply

    cfg = CONFIGS[name]
    live.show("task")
    live.show(cfg)
    whole = _params(live.model)
    monkeypatch.setattr(apply, "LARGE_BLOCK_BYTES", 4096)
    emb = live.params["model.embed_tokens.weight"]
    assert len(apply.row_blocks(emb.shape, "linear", apply.LARGE_BLOCK_BYTES)) > 10
    assert len(apply.row_blocks(emb.shape, "ties", apply.LARGE_BLOCK_BYTES)) > 10
    live.show("task")
    live.show(cfg)
    for n, p in live.model.named_parameters():
        assert torch.equal(p, whole[n]), n


def test_bf16_live_model_gives_its_head_a_contiguous_input(tiny):
    """In bf16 on the CPU the LM head gets a contiguous input (the strided last-position slice
    takes a matmul path that holds several copies of the head's weight); outputs are the head
    applied to that slice, and generation works."""
    live = LiveModel.from_refs(tiny["task"], tiny["lang"], tiny["base"], dtype=torch.bfloat16)
    head = live.model.get_output_embeddings()
    assert head._forward_pre_hooks
    hidden = torch.randn(2, 7, head.weight.shape[1], dtype=torch.bfloat16)
    with torch.inference_mode():
        got = head(hidden[:, -1:, :])
        want = torch.nn.functional.linear(hidden[:, -1:, :].contiguous(), head.weight)
    assert torch.equal(got, want)
    ids = live.tokenizer("2 + 3 =", return_tensors="pt")
    assert live.model.generate(**ids, max_new_tokens=3, do_sample=False).shape[1] > ids["input_ids"].shape[1]
    fp32 = LiveModel.from_refs(tiny["task"], tiny["lang"], tiny["base"])
    assert not fp32.model.get_output_embeddings()._forward_pre_hooks
