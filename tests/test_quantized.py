"""Quantized checkpoints (issue #65): tiny hand-written folders laid out as gpt-oss ships MXFP4
(``*_blocks``/``*_scales`` uint8 beside bf16 biases, a ``quantization_config``) and DeepSeek-V3
ships FP8 blocks (float8 e4m3 weights with ``weight_scale_inv``) are refused in one line, naming
the quantization and what to do, by `layerswap check`, the merge, the live engine and the
analysis; never merged as if their blocks were weights."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from layerswap_core.checkpoints.compatibility import checked_models, open_models
from layerswap_core.checkpoints.preflight import check
from layerswap_core.checkpoints.quantized import quantization
from layerswap_core.merge.config import MergeConfig
from layerswap_core.merge.errors import MergeError
from layerswap_core.merge.executor import merge_to_folder, open_inputs

H, V, E, I = 64, 32, 4, 64   # hidden, vocabulary, experts, expert width


def _gpt_oss_mxfp4(gen) -> tuple[dict, dict]:
    """gpt-oss's layout: each expert matrix as 4-bit values packed two per byte in blocks of 32
    (``_blocks``: [E, rows, cols/32, 16] uint8) and one exponent per block (``_scales``)."""
    config = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"],
              "num_hidden_layers": 1, "hidden_size": H, "vocab_size": V,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "num_local_experts": E, "experts_per_token": 2, "intermediate_size": I,
              "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                  "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                  "lm_head"]}}
    p = "model.layers.0."
    bf = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H),
          p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
          p + "self_attn.q_proj.weight": (H, H), p + "self_attn.k_proj.weight": (32, H),
          p + "self_attn.v_proj.weight": (32, H), p + "self_attn.o_proj.weight": (H, H),
          p + "self_attn.sinks": (4,), p + "mlp.router.weight": (E, H), p + "mlp.router.bias": (E,),
          p + "mlp.experts.gate_up_proj_bias": (E, 2 * I), p + "mlp.experts.down_proj_bias": (E, H)}
    tensors = {n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in bf.items()}
    for name, rows, cols in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
        tensors[p + f"mlp.experts.{name}_blocks"] = torch.randint(
            0, 256, (E, rows, cols // 32, 16), generator=gen, dtype=torch.uint8)
        tensors[p + f"mlp.experts.{name}_scales"] = torch.randint(
            120, 130, (E, rows, cols // 32), generator=gen, dtype=torch.uint8)
    return config, tensors


def _deepseek_fp8(gen) -> tuple[dict, dict]:
    """DeepSeek-V3's layout: linear weights in float8 e4m3, each with a float32
    ``weight_scale_inv`` per 128 x 128 block; norms, router and embeddings in bf16."""
    config = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
              "num_hidden_layers": 1, "hidden_size": H, "vocab_size": V,
              "num_attention_heads": 4, "n_routed_experts": E, "num_experts_per_tok": 2,
              "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": [128, 128]}}
    p = "model.layers.0."
    bf = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H),
          p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
          p + "mlp.gate.weight": (E, H), p + "mlp.gate.e_score_correction_bias": (E,)}
    tensors = {n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in bf.items()}
    linear = [p + f"self_attn.{n}" for n in ("q_proj", "kv_a_proj_with_mqa", "o_proj")] + \
        [p + f"mlp.experts.{e}.{n}" for e in range(E) for n in ("gate_proj", "up_proj",
                                                               "down_proj")]
    for n in linear:
        tensors[n + ".weight"] = torch.randn((H, H), generator=gen).to(torch.float8_e4m3fn)
        tensors[n + ".weight_scale_inv"] = torch.rand((1, 1), generator=gen)
    return config, tensors


LAYOUTS = {"mxfp4": _gpt_oss_mxfp4, "fp8": _deepseek_fp8}


def _trio(root, layout: str, with_config: bool = True) -> dict:
    paths = {}
    for seed, role in enumerate(("base", "task", "lang")):
        config, tensors = LAYOUTS[layout](torch.Generator().manual_seed(seed))
        if not with_config:
            config.pop("quantization_config")
        folder = paths[role] = root / role
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(config))
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return paths


@pytest.mark.parametrize("layout, said", [("mxfp4", "MXFP4"), ("fp8", "FP8 blocks")])
def test_a_quantized_trio_is_refused_everywhere_in_one_line(tmp_path, layout, said):
    paths = _trio(tmp_path, layout)
    pf = check(str(paths["base"]), str(paths["task"]), str(paths["lang"]))
    assert not pf.ok and len(pf.problems) == 1
    refusal = pf.refusal
    assert "\n" not in refusal and said in refusal and f"quant_method '{layout}'" in refusal
    assert "task, lang, base are" in refusal and "use a dequantized bf16 copy" in refusal
    assert ("Mxfp4Config(dequantize=True)" if layout == "mxfp4" else
            "FineGrainedFP8Config(dequantize=True)") in refusal
    assert pf.lines()[-1] == f"refused: {refusal}"

    from layerswap_core.workbench.models import check_models
    report = check_models(str(paths["base"]), str(paths["task"]), str(paths["lang"]))
    assert not report.ok and "quantized checkpoint" in report.markdown()

    from layerswap_core.cli import main
    assert main(["check", "--task", str(paths["task"]), "--lang", str(paths["lang"]),
                 "--base", str(paths["base"])]) == 1

    for cfg in (MergeConfig(partition=[{"layers": "0", "kinds": "mlp"}], non_layer="task"),
                MergeConfig(method="soup")):
        with pytest.raises(MergeError, match=f"cannot merge: quantized checkpoint: .*{said}"):
            merge_to_folder(cfg, task=paths["task"], lang=paths["lang"], base=paths["base"],
                            out=tmp_path / "m")
        assert not (tmp_path / "m").exists()

    # a record of these models made without the check (a session's) is refused all the same
    record = checked_models(open_models({r: paths[r] for r in ("task", "lang", "base")}))
    with pytest.raises(MergeError, match="quantized checkpoint"):
        open_inputs(paths["task"], paths["lang"], paths["base"], checked=record)

    from layerswap_core.merge.live import LiveModel
    with pytest.raises(MergeError, match=f"cannot build the live model: quantized .*{said}"):
        LiveModel(open_models({r: paths[r] for r in ("task", "lang", "base")}))

    from layerswap_core.analysis.deltas import delta_stats
    with pytest.raises(Exception, match="quantized checkpoint"):
        delta_stats(paths["base"], paths["task"], cache=False)


@pytest.mark.parametrize("layout, said, tensor", [
    ("mxfp4", "MXFP4-style blocks and scales", "_blocks"),
    ("fp8", "FP8 (e4m3)", ".weight")])
def test_quantized_tensors_are_recognised_without_a_quantization_config(tmp_path, layout, said,
                                                                         tensor):
    """A copy that lost its quantization_config is still refused, from the headers' names and
    dtypes."""
    paths = _trio(tmp_path, layout, with_config=False)
    refusal = check(str(paths["base"]), str(paths["task"]), str(paths["lang"])).refusal
    assert refusal and said in refusal and "no quantization_config" in refusal
    assert tensor in refusal


def test_plain_weights_are_not_taken_for_quantized():
    assert quantization({"model_type": "llama"}, [("model.layers.0.mlp.up_proj.weight", "BF16"),
                                                  ("model.layers.0.layer_scales", "F32"),
                                                  ("model.conv_blocks", "F32")]) is None
    assert "bitsandbytes" in quantization(
        {"quantization_config": {"load_in_4bit": True}}, [])
    assert quantization({}, [("model.layers.0.mlp.up_proj.qweight", "I32")]).startswith(
        "quantized as packed integers with scales")
