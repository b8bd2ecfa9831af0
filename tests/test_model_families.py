import pytest

from layerswap_core.checkpoints.architectures import (FAMILIES, KIND_GROUPS, classify,
                                                      get_architecture, param_names_from_config)

LLAMA = {"model_type": "llama", "num_hidden_layers": 32}


@pytest.mark.parametrize("model_type,name,expected", [
    ("llama", "model.layers.3.self_attn.q_proj.weight", (3, "attn_q")),
    ("llama", "model.layers.31.mlp.down_proj.weight", (31, "mlp_down")),
    ("llama", "model.layers.0.input_layernorm.weight", (0, "norm_attn")),
    ("llama", "model.layers.0.post_attention_layernorm.weight", (0, "norm_mlp")),
    ("llama", "model.embed_tokens.weight", (None, "embed")),
    ("llama", "model.norm.weight", (None, "final_norm")),
    ("llama", "lm_head.weight", (None, "lm_head")),
    ("mistral", "model.layers.7.self_attn.v_proj.weight", (7, "attn_v")),
    ("qwen2", "model.layers.2.self_attn.k_proj.bias", (2, "attn_k")),
    ("qwen3", "model.layers.2.self_attn.q_norm.weight", (2, "norm_qk")),
    ("gemma", "model.layers.5.mlp.gate_proj.weight", (5, "mlp_gate")),
    ("gemma2", "model.layers.5.post_attention_layernorm.weight", (5, "norm_attn_post")),
    ("gemma2", "model.layers.5.pre_feedforward_layernorm.weight", (5, "norm_mlp")),
    ("gemma3_text", "model.layers.1.post_feedforward_layernorm.weight", (1, "norm_mlp_post")),
    ("gemma3", "model.language_model.layers.4.self_attn.o_proj.weight", (4, "attn_o")),
    ("gemma3", "model.language_model.embed_tokens.weight", (None, "embed")),
    ("cohere", "model.layers.9.input_layernorm.weight", (9, "norm_attn")),
    ("cohere", "model.layers.9.mlp.up_proj.weight", (9, "mlp_up")),
    ("gpt_neox", "gpt_neox.layers.4.attention.query_key_value.weight", (4, "attn_qkv")),
    ("gpt_neox", "gpt_neox.layers.4.mlp.dense_4h_to_h.bias", (4, "mlp_down")),
    ("gpt_neox", "gpt_neox.embed_in.weight", (None, "embed")),
    ("gpt_neox", "gpt_neox.final_layer_norm.weight", (None, "final_norm")),
    ("gpt_neox", "embed_out.weight", (None, "lm_head")),
    ("falcon", "transformer.h.11.self_attention.dense.weight", (11, "attn_o")),
    ("falcon", "transformer.h.11.mlp.dense_h_to_4h.weight", (11, "mlp_up")),
    ("falcon", "transformer.word_embeddings.weight", (None, "embed")),
    ("falcon", "transformer.ln_f.bias", (None, "final_norm")),
    ("phi3", "model.layers.3.self_attn.qkv_proj.weight", (3, "attn_qkv")),
    ("phi3", "model.layers.3.mlp.gate_up_proj.weight", (3, "mlp_gate_up")),
])
def test_classify_per_family(model_type, name, expected):
    arch = get_architecture({"model_type": model_type, "num_hidden_layers": 12})
    assert not arch.is_fallback
    assert tuple(arch.classify(name)) == expected


def test_num_layers_from_config_variants():
    assert get_architecture(LLAMA).num_layers == 32
    assert get_architecture({"model_type": "falcon", "n_layer": 60}).num_layers == 60
    nested = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text",
                                                      "num_hidden_layers": 26}}
    assert get_architecture(nested).num_layers == 26
    with pytest.raises(ValueError, match="number of layers"):
        get_architecture({"model_type": "llama"})


def test_unknown_architecture_falls_back_to_regex_and_says_so():
    arch = get_architecture({"model_type": "brand_new_lm", "num_layers": 4})
    assert arch.is_fallback and "generic" in arch.describe()
    assert arch.classify("backbone.blocks.2.attn.weight").layer == 2
    assert arch.classify("model.layers.3.self_attn.q_proj.weight") == (3, "attn_q")
    assert arch.classify("transformer.h.1.whatever.weight") == (1, "other")
    assert arch.classify("model.embed_tokens.weight") == (None, "embed")


def test_every_family_kind_is_known():
    known = {k for g in KIND_GROUPS.values() for k in g} | {"embed", "final_norm", "lm_head"}
    for fam in FAMILIES:
        assert set(fam.layer_kinds.values()) <= known, fam.name
        assert set(fam.global_kinds.values()) <= known, fam.name


def test_param_names_from_config_match_a_real_checkpoint(tiny):
    from layerswap_core.checkpoints.reading import CheckpointReader

    reader = CheckpointReader(tiny["base"])
    names = param_names_from_config(reader.config())
    assert sorted(names) == sorted(reader.names())
    arch = get_architecture(reader.config())
    layers = {classify(n, arch.family).layer for n in names} - {None}
    assert layers == set(range(arch.num_layers))


# --------------------------------------------------------------------------- derived kinds (#65)
DENSE_HAND_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "cohere2",
                    "phi3", "granite", "smollm3")


@pytest.mark.parametrize("model_type,name,expected", [
    ("mixtral", "model.layers.1.block_sparse_moe.experts.7.w1.weight", (1, "moe_experts")),
    ("mixtral", "model.layers.1.block_sparse_moe.gate.weight", (1, "moe_router")),
    ("qwen2_moe", "model.layers.0.mlp.experts.12.down_proj.weight", (0, "moe_experts")),
    ("qwen2_moe", "model.layers.0.mlp.shared_expert.up_proj.weight", (0, "moe_shared")),
    ("qwen2_moe", "model.layers.0.mlp.shared_expert_gate.weight", (0, "moe_shared")),
    ("qwen3_moe", "model.layers.3.mlp.gate.weight", (3, "moe_router")),
    ("gpt_oss", "model.layers.2.mlp.experts.gate_up_proj_bias", (2, "moe_experts")),
    ("gpt_oss", "model.layers.2.mlp.router.bias", (2, "moe_router")),
    ("gpt_oss", "model.layers.2.self_attn.sinks", (2, "attn_sinks")),
    ("deepseek_v3", "model.layers.5.mlp.gate.e_score_correction_bias", (5, "moe_router")),
    ("deepseek_v3", "model.layers.5.mlp.shared_experts.gate_proj.weight", (5, "moe_shared")),
    ("deepseek_v3", "model.layers.5.self_attn.kv_b_proj.weight", (5, "attn_kv")),
    ("deepseek_v3", "model.layers.0.mlp.gate_proj.weight", (0, "mlp_gate")),
    ("llama4_text", "model.layers.1.feed_forward.experts.down_proj", (1, "moe_experts")),
    ("llama4_text", "model.layers.1.feed_forward.router.weight", (1, "moe_router")),
    ("granitemoe", "model.layers.1.block_sparse_moe.input_linear.weight", (1, "moe_experts")),
    ("granitemoe", "model.layers.1.block_sparse_moe.router.layer.weight", (1, "moe_router")),
    ("glm4_moe", "model.layers.1.mlp.gate.e_score_correction_bias", (1, "moe_router")),
    ("starcoder2", "model.layers.1.mlp.c_fc.bias", (1, "mlp_up")),
    ("starcoder2", "model.layers.1.mlp.c_proj.weight", (1, "mlp_down")),
    ("olmo2", "model.layers.1.post_attention_layernorm.weight", (1, "norm_attn_post")),
    ("olmo2", "model.layers.1.post_feedforward_layernorm.weight", (1, "norm_mlp_post")),
])
def test_classify_moe_and_derived_families(model_type, name, expected):
    arch = get_architecture({"model_type": model_type, "num_hidden_layers": 8})
    assert not arch.is_fallback and arch.name == model_type
    assert tuple(arch.classify(name)) == expected
    if expected[1].startswith("moe_"):
        assert expected[1] in KIND_GROUPS["mlp"]


def test_mixtral_is_not_a_llama_and_moe_facts_come_from_the_config():
    arch = get_architecture({"model_type": "mixtral", "num_hidden_layers": 32,
                             "num_local_experts": 8, "num_experts_per_tok": 2})
    assert arch.name == "mixtral" and arch.moe() == "MoE: 8 experts, 2 active"
    deepseek = get_architecture({"model_type": "deepseek_v3", "num_hidden_layers": 61,
                                 "n_routed_experts": 256, "num_experts_per_tok": 8})
    assert deepseek.moe() == "MoE: 256 experts, 8 active" and "MoE" in deepseek.describe()
    assert get_architecture(LLAMA).moe() == ""


def test_shipped_kinds_table_is_what_transformers_derives():
    """The shipped table (kinds_table.py) derived again from transformers' modules: regenerate
    it with `python -m layerswap_core.checkpoints.derive_kinds` when this fails."""
    from layerswap_core.checkpoints.derive_kinds import DERIVED_TYPES, derive_kinds
    from layerswap_core.checkpoints.kinds_table import KINDS

    assert tuple(KINDS) == DERIVED_TYPES
    for model_type in DERIVED_TYPES:
        derived = derive_kinds(model_type)
        assert derived == KINDS[model_type], model_type
        assert "other" not in derived["layer"].values(), model_type


@pytest.mark.parametrize("model_type", DENSE_HAND_TYPES)
def test_hand_families_agree_with_what_transformers_derives(model_type):
    from layerswap_core.checkpoints.derive_kinds import derive_kinds

    arch = get_architecture({"model_type": model_type, "num_hidden_layers": 2})
    derived = derive_kinds(model_type)
    for rest, kind in derived["layer"].items():
        assert arch.classify(f"model.layers.1.{rest}.weight") == (1, kind), (model_type, rest)
    for name, kind in derived["global"].items():
        assert arch.classify(f"{name}.weight") == (None, kind), (model_type, name)
