"""LoRA layer swapping: merging adapters equals layer-swapping the adapters' dense models."""
from __future__ import annotations

import json

import pytest
import torch

from layerswap_core.merge import lora
from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.merge.executor import merge_to_folder
from layerswap_core.merge.config import MergeConfig

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base, out, *, seed, r, alpha, targets=ALL, rslora=False):
    """A real PEFT adapter over ``base`` with random (non-zero) A and B."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                             use_rslora=rslora, task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def family(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = tiny["base"]
    task = make_adapter(base, root / "task_adapter", seed=1, r=4, alpha=8)
    # the language adapter: other rank, rsLoRA, and no MLP down projection
    lang = make_adapter(base, root / "lang_adapter", seed=2, r=2, alpha=3, rslora=True,
                        targets=ALL[:-1])
    dense = {k: lora.apply_adapter(base, a, root / f"{k}_dense", dtype=torch.float32)
             for k, a in (("task", task), ("lang", lang))}
    return {"base": base, "task": task, "lang": lang, "dense": dense, "root": root}


def _tensors(folder):
    r = CheckpointReader(folder)
    return {n: r.get(n).float() for n in r.names()}


CONFIGS = {
    "transitions": MergeConfig(bottom=2, top=1, transition_bottom=1, transition_top=2,
                               w_task=2.0, w_lang=1.0),
    "partition_A": MergeConfig(partition="A", scale_partition=True),
    "soup": MergeConfig(method="soup", w_task=1.0, w_lang=3.0),
    "task_arithmetic": MergeConfig(method="task_arithmetic", lambda_task=0.7, lambda_lang=1.3),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_adapter_swap_equals_dense_swap(family, tmp_path, name):
    cfg = CONFIGS[name]
    base_arg = family["base"] if cfg.method == "task_arithmetic" else None
    ref = _tensors(merge_to_folder(cfg, family["dense"]["task"], family["dense"]["lang"],
                                   base_arg, tmp_path / "ref"))
    dense = _tensors(lora.merge_adapters(cfg, family["task"], family["lang"], family["base"],
                                         tmp_path / "dense", dense=True, dtype=torch.float32))
    assert set(dense) == set(ref)
    for n in ref:
        torch.testing.assert_close(dense[n], ref[n], atol=2e-6, rtol=1e-5, msg=n)

    # the adapter output, loaded with PEFT over the base, gives the same weights
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    out = lora.merge_adapters(cfg, family["task"], family["lang"], family["base"],
                              tmp_path / "adapter", dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(family["base"], dtype=torch.float32)
    merged = dict(PeftModel.from_pretrained(model, str(out)).merge_and_unload().named_parameters())
    for n, p in merged.items():
        torch.testing.assert_close(p.detach(), ref[n], atol=2e-6, rtol=1e-5, msg=n)


def test_layer_swap_selects_adapter_weights_per_layer(family):
    from layerswap_core.checkpoints.architectures import get_architecture
    adapters = {k: lora.load_adapter(family[k], family["base"]) for k in ("task", "lang")}
    arch = get_architecture(CheckpointReader(family["base"]).config())
    merged = lora.combine_adapters(MergeConfig(bottom=2, top=1), adapters, arch)
    q = "model.layers.{}.self_attn.q_proj"
    assert merged[q.format(0)].rank == 2 and merged[q.format(7)].rank == 2   # language adapter
    assert merged[q.format(4)].rank == 4                                      # task adapter
    assert "model.layers.0.mlp.down_proj" not in merged  # the language adapter has none there
    torch.testing.assert_close(merged[q.format(4)].delta(), adapters["task"].modules[q.format(4)].delta())
    blend = lora.combine_adapters(MergeConfig(bottom=2, top=1, transition_bottom=1), adapters, arch)
    assert blend[q.format(2)].rank == 6  # ranks concatenated in the transition layer


def test_adapter_config_is_valid_peft(family, tmp_path):
    out = lora.merge_adapters(MergeConfig(bottom=2, top=1, transition_bottom=1), family["task"],
                              family["lang"], family["base"], tmp_path / "a")
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["r"] == 6 and cfg["lora_alpha"] == 6
    assert cfg["base_model_name_or_path"] == str(family["base"])
    assert (out / "layerswap.yaml").exists()


def test_mismatched_adapter_base(family, tmp_path):
    from layerswap_core.testing import make_tiny_model
    other = make_tiny_model(tmp_path / "other", hidden=32, num_layers=8)
    with pytest.raises(lora.AdapterError, match="not made for base.*32"):
        lora.load_adapter(family["task"], other)
    shallow = make_tiny_model(tmp_path / "shallow", num_layers=4)
    with pytest.raises(lora.AdapterError, match="model.layers.[4-7].*does not have"):
        lora.merge_adapters(MergeConfig(), family["task"], family["lang"], shallow, tmp_path / "o")


def test_unsupported_methods_and_folders(family, tmp_path):
    with pytest.raises(lora.AdapterError, match="not linear"):
        lora.merge_adapters(MergeConfig(method="ties"), family["task"], family["lang"],
                            family["base"], tmp_path / "o")
    with pytest.raises(lora.AdapterError, match="not a PEFT adapter"):
        lora.load_adapter(family["base"])
    assert not (tmp_path / "o").exists()


def test_cli_merge_lora(family, tmp_path):
    from layerswap_core.cli import main
    out = tmp_path / "cli"
    rc = main(["merge-lora", "--task", str(family["task"]), "--lang", str(family["lang"]),
               "--base", str(family["base"]), "--bottom", "2", "--top", "1", "--out", str(out),
               "--dense", "--dtype", "float32"])
    assert rc == 0
    ref = _tensors(merge_to_folder(MergeConfig(bottom=2, top=1), family["dense"]["task"],
                                   family["dense"]["lang"], None, tmp_path / "ref"))
    got = _tensors(out)
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], atol=2e-6, rtol=1e-5, msg=n)


@pytest.mark.parametrize("adapter_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", ["task", "lang"])
def test_apply_adapter_is_bit_identical_to_peft_merge_and_unload(family, tmp_path, which,
                                                                 adapter_dtype):
    """The streaming apply (no model built) writes what PEFT's merge_and_unload gives, to the
    bit, for plain and rsLoRA adapters stored in float32 or bfloat16 (as the demo adapters)."""
    import shutil

    from peft import PeftModel
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"
    shutil.copytree(family[which], adapter)
    weights = adapter / "adapter_model.safetensors"
    save_file({k: v.to(adapter_dtype) for k, v in load_file(str(weights)).items()}, str(weights))
    model = AutoModelForCausalLM.from_pretrained(family["base"], dtype=torch.float32)
    for dtype in (torch.float32, torch.bfloat16):
        want = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().to(dtype)
        want = {n: t for n, t in want.state_dict().items()}
        model = AutoModelForCausalLM.from_pretrained(family["base"], dtype=torch.float32)
        out = lora.apply_adapter(family["base"], adapter, tmp_path / f"dense_{dtype}", dtype=dtype)
        r = CheckpointReader(out)
        got = {n: r.get(n) for n in r.names()}
        adapted = {m + ".weight" for m in lora.load_adapter(adapter).modules}
        assert adapted <= set(got) and set(got) <= set(want)
        for n, t in got.items():
            assert t.dtype == dtype and torch.equal(t, want[n]), n
        base = CheckpointReader(family["base"])
        assert all(not torch.equal(got[n].float(), base.get(n).float()) for n in adapted)
        assert json.loads((out / "config.json").read_text())["dtype"] == str(dtype)[6:]


def test_cli_merge_lora_names_an_invalid_config_json(family, tmp_path, capsys):
    import shutil
    from pathlib import Path

    from layerswap_core.cli import main
    bad_adapter = Path(shutil.copytree(family["task"], tmp_path / "bad_adapter"))
    (bad_adapter / "adapter_config.json").write_text("{oops")
    bad_base = Path(shutil.copytree(family["base"], tmp_path / "bad_base"))
    (bad_base / "config.json").write_text("")
    out = tmp_path / "o"
    for task, base, named in ((bad_adapter, family["base"], bad_adapter / "adapter_config.json"),
                              (family["task"], bad_base, bad_base / "config.json")):
        rc = main(["merge-lora", "--task", str(task), "--lang", str(family["lang"]),
                   "--base", str(base), "--out", str(out)])
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err
        (line,) = [ln for ln in err.splitlines() if "layerswap merge-lora: error: " in ln]
        assert f"{named}: not valid JSON" in line
    assert not out.exists()
    assert lora.is_adapter(family["task"]) and not lora.is_adapter(family["base"])
    assert not lora.is_adapter(family["task"] / "adapter_config.json")  # a file, not a folder


def test_cli_merge_lora_overwrites_only_layerswap_outputs_unless_forced(family, tmp_path, capsys):
    from layerswap_core.cli import main
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("keep me")
    args = ["merge-lora", "--task", str(family["task"]), "--lang", str(family["lang"]),
            "--base", str(family["base"]), "--bottom", "2", "--top", "1", "--out", str(victim),
            "--overwrite"]
    assert main(args) == 2
    assert "not a layerswap output" in capsys.readouterr().err
    assert (victim / "notes.txt").read_text() == "keep me"
    assert main(args + ["--force"]) == 0
    assert not (victim / "notes.txt").exists() and (victim / "adapter_config.json").exists()
