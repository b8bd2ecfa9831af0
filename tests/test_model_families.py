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
