"""LoRA layer swapping: merging adapters equals layer-swapping the adapters' dense models."""
from __future__ import annotations

import json

import pytest
import torch

from layerswap_core.checkpoints import adapters as peft_io
from layerswap_core.merge import lora
from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.checkpoints.references import is_adapter
from layerswap_core.merge.executor import merge_to_folder
from layerswap_core.merge.config import MergeConfig

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base, out, *, seed, r, alpha, targets=ALL, rslora=False):
    """A real PEFT adapter over ``base`` with random (non-zero) A and B."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return _random_adapter(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                             use_rslora=rslora, task_type="CAUSAL_LM"), out, seed)


@pytest.fixture(scope="module")
def family(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = tiny["base"]
    task = make_adapter(base, root / "task_adapter", seed=1, r=4, alpha=8)
    # the language adapter: other rank, rsLoRA, and no MLP down projection
    lang = make_adapter(base, root / "lang_adapter", seed=2, r=2, alpha=3, rslora=True,
                        targets=ALL[:-1])
    dense = {k: peft_io.apply_adapter(base, a, root / f"{k}_dense", dtype=torch.float32)
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
    adapters = {k: peft_io.load_adapter(family[k], family["base"]) for k in ("task", "lang")}
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
    with pytest.raises(peft_io.AdapterError, match="not made for base.*32"):
        peft_io.load_adapter(family["task"], other)
    shallow = make_tiny_model(tmp_path / "shallow", num_layers=4)
    with pytest.raises(peft_io.AdapterError, match="model.layers.[4-7].*does not have"):
        lora.merge_adapters(MergeConfig(), family["task"], family["lang"], shallow, tmp_path / "o")


def test_unsupported_methods_and_folders(family, tmp_path):
    with pytest.raises(peft_io.AdapterError, match="not linear"):
        lora.merge_adapters(MergeConfig(method="ties"), family["task"], family["lang"],
                            family["base"], tmp_path / "o")
    with pytest.raises(peft_io.AdapterError, match="not a PEFT adapter"):
        peft_io.load_adapter(family["base"])
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
        out = peft_io.apply_adapter(family["base"], adapter, tmp_path / f"dense_{dtype}", dtype=dtype)
        r = CheckpointReader(out)
        got = {n: r.get(n) for n in r.names()}
        adapted = {m + ".weight" for m in peft_io.load_adapter(adapter).modules}
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
    assert is_adapter(family["task"]) and not is_adapter(family["base"])
    assert not is_adapter(family["task"] / "adapter_config.json")  # a file, not a folder


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


def _peft_dense(base, adapter):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().state_dict()


def _random_adapter(model, cfg, out, seed=3):
    """``model`` with the LoRA of ``cfg``, A and B random (non-zero), saved as ``out``."""
    from peft import get_peft_model

    peft_model = get_peft_model(model, cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    peft_model.save_pretrained(out)
    return out


def test_one_reader_for_embedding_lora_patterns_and_the_alpha_default(family, tmp_path):
    """load_adapter (merge, analysis, the app) reads embedding LoRA, rank/alpha patterns (PEFT's
    get_pattern_key) and a config without lora_alpha (PEFT's default 8) as PEFT merges them."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    from layerswap_core.analysis.providers import LoraDeltaProvider

    model = AutoModelForCausalLM.from_pretrained(family["base"], dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=16, target_modules=["embed_tokens", "q_proj", "down_proj"],
                     rank_pattern={"down_proj": 2}, alpha_pattern={"layers.1.self_attn.q_proj": 3})
    adapter = _random_adapter(model, cfg, tmp_path / "adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    del config["lora_alpha"]  # PEFT reads the default (8) for it
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    want = _peft_dense(family["base"], adapter)
    read = peft_io.load_adapter(adapter, family["base"])
    emb = read.modules["model.embed_tokens"]
    assert emb.embedding and emb.shape == tuple(want["model.embed_tokens.weight"].shape)
    assert read.modules["model.layers.0.mlp.down_proj"].scale == 8 / 2
    assert read.modules["model.layers.1.self_attn.q_proj"].scale == 3 / 4
    assert read.modules["model.layers.2.self_attn.q_proj"].scale == 8 / 4
    out = peft_io.apply_adapter(family["base"], adapter, tmp_path / "dense", dtype=torch.float32)
    got, base = CheckpointReader(out), CheckpointReader(family["base"])
    provider = LoraDeltaProvider(adapter)
    for m in read.modules:
        n = m + ".weight"
        assert torch.equal(got.get(n), want[n]), n
        torch.testing.assert_close(base.get(n) + provider(n), want[n], msg=n)
    assert provider("model.norm.weight") is None


def test_fan_in_fan_out_adapters_are_transposed(tmp_path):
    """GPT-2 stores its projections (in, out) (Conv1D): PEFT's fan_in_fan_out adapters."""
    from peft import LoraConfig
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                               n_positions=32)).save_pretrained(tmp_path / "gpt2")
    model = GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2")
    adapter = _random_adapter(model, LoraConfig(r=2, target_modules=["c_attn"],
                                                fan_in_fan_out=True), tmp_path / "adapter")
    want = _peft_dense(tmp_path / "gpt2", adapter)
    read = peft_io.load_adapter(adapter, tmp_path / "gpt2")
    c_attn = read.modules["transformer.h.0.attn.c_attn"]
    assert c_attn.fan_in_fan_out and c_attn.shape == (32, 96)
    got = CheckpointReader(peft_io.apply_adapter(tmp_path / "gpt2", adapter, tmp_path / "dense",
                                              dtype=torch.float32))
    for m in read.modules:
        assert torch.equal(got.get(m + ".weight"), want[m + ".weight"]), m


def test_extract_adapter_recovers_a_low_rank_change_and_peft_loads_it(family, tmp_path):
    """A 'fully fine-tuned' expert whose projections changed by a rank-4 LoRA comes back
    exactly at rank 4 (every other tensor untouched), as a PEFT adapter PEFT itself loads."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tuned = family["dense"]["task"]
    res = lora.extract_adapter(family["base"], tuned, tmp_path / "x", rank=4, dtype=torch.float32)
    assert res["modules"] == 7 * 8 and res["kept"] == pytest.approx(1.0, abs=1e-6)
    back = _tensors(peft_io.apply_adapter(family["base"], res["out"], tmp_path / "xd",
                                       dtype=torch.float32))
    want = _tensors(tuned)
    assert set(back) == set(want)
    for n in want:
        assert torch.allclose(back[n], want[n], atol=2e-5), n
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    base_model = AutoModelForCausalLM.from_pretrained(family["base"], dtype=torch.float32)
    peft_logits = PeftModel.from_pretrained(base_model, res["out"])(ids).logits
    dense_logits = AutoModelForCausalLM.from_pretrained(tuned, dtype=torch.float32)(ids).logits
    assert torch.allclose(peft_logits, dense_logits, atol=1e-4)


def test_extract_adapter_lower_rank_keeps_the_largest_directions(family, tmp_path):
    """Rank 1 of a rank-4 change keeps its top singular direction: the kept share is below 1
    and equals 1 - (residual / change) in squared Frobenius norm, summed over modules."""
    tuned = family["dense"]["task"]
    res = lora.extract_adapter(family["base"], tuned, tmp_path / "x1", rank=1, dtype=torch.float32)
    assert 0 < res["kept"] < 1
    adapter = peft_io.load_adapter(res["out"], family["base"])
    base, want = _tensors(family["base"]), _tensors(tuned)
    change = residual = 0.0
    for m, lm in adapter.modules.items():
        assert lm.rank == 1
        d = want[m + ".weight"] - base[m + ".weight"]
        change += float((d ** 2).sum())
        residual += float(((d - lm.delta()) ** 2).sum())
    assert 1 - residual / change == pytest.approx(res["kept"], rel=1e-4)


def test_extract_adapter_refuses_a_model_of_another_shape(family, tmp_path, tiny):
    from layerswap_core.testing import make_tiny_model

    other = make_tiny_model(tmp_path / "other", num_layers=8, hidden=32)
    with pytest.raises(peft_io.AdapterError, match="does not fit"):
        lora.extract_adapter(family["base"], other, tmp_path / "bad", rank=2)
    assert not (tmp_path / "bad").exists()


def test_an_adapter_the_reader_refuses_is_merged_once_by_peft(family, tmp_path, monkeypatch):
    """DoRA is not plain LoRA: the dense copy comes from PEFT's merge_and_unload, built once
    into the cache (a second call reads it), with no temporary folder left beside it."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    from layerswap_core.checkpoints.loading import dense_from_adapter

    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "cache"))
    model = AutoModelForCausalLM.from_pretrained(family["base"], dtype=torch.float32)
    folder = _random_adapter(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"],
                                               use_dora=True, task_type="CAUSAL_LM"),
                             tmp_path / "dora", 5)
    with pytest.raises(peft_io.AdapterError, match="use_dora"):
        peft_io.load_adapter(folder, family["base"])
    out = dense_from_adapter(folder, family["base"])
    from peft import PeftModel
    base = AutoModelForCausalLM.from_pretrained(family["base"], dtype=torch.float32)
    want = PeftModel.from_pretrained(base, str(folder)).merge_and_unload().state_dict()
    got = _tensors(out)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(got[q], want[q]) and not torch.equal(got[q], _tensors(family["base"])[q])
    assert dense_from_adapter(folder, family["base"]) == out
    assert [p.name for p in out.parent.iterdir()] == [out.name]


def test_the_adapter_reader_takes_a_base_folder_not_a_reference(family):
    """checkpoints.adapters sits below the resolver: a reference is refused in one line."""
    with pytest.raises(peft_io.AdapterError, match="not a model folder") as e:
        peft_io.load_adapter(family["task"], "embedded:smollm2-135m-instruct")
    assert "\n" not in str(e.value)
    assert peft_io.load_adapter(family["task"], family["base"]).modules
