"""The kinds of a model type's parameters, derived from transformers' own model (issue #65).

``derive_kinds(model_type)`` builds a tiny random model from transformers' config class for the
type (``tiny_model_config``: 2 layers, hidden 32, 4 experts, 2 active), saves it with
``save_pretrained`` (so the names are the checkpoint's, as transformers writes them back), maps
each checkpoint name to the model's parameter through transformers' conversion mapping
(``conversion_mapping.get_model_conversion_mapping``: fused experts, renamed blocks) and gives it
the kind its module says:

- under a module that holds the experts (a class named ``...Experts``): ``moe_experts``; under a
  router (``...Router``) in that block: ``moe_router``; anything else of that block (shared
  experts and their gate): ``moe_shared``;
- under the attention module (``...Attention``): its projection's kind by the projection's name;
  a parameter of the attention module itself (gpt-oss's sinks): ``attn_sinks``; a norm inside
  it: ``norm_qk``;
- under the dense feed-forward (``...MLP``/``...FeedForward``): its projection's kind;
- a norm of the layer by where the data flows in one forward pass (hooks): its output the
  attention's input (``norm_attn``), its input the attention's output (``norm_attn_post``), its
  output the feed-forward's input (``norm_mlp``), its input the feed-forward's output
  (``norm_mlp_post``).

The result, layer-relative names with expert numbers as ``*``, is written once into
``kinds_table.py`` (``python -m layerswap_core.checkpoints.derive_kinds``), which ships: the merge
never imports torch or transformers for it. ``tests/test_model_families.py`` derives it again
and compares. A model type the table lacks but the installed transformers knows is derived the
same way when a model of it is first opened (``derive_at_run_time``, called by
``architectures.get_architecture``; once per type and process). torch and transformers are
imported inside the functions only: ``architectures`` imports this module at its top.
"""
from __future__ import annotations

import re
from pathlib import Path

# The model types whose kinds the shipped table holds (the hand families in architectures.py
# are checked against the same derivation in the tests).
DERIVED_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "deepseek_v3", "llama4_text",
                 "granitemoe", "glm4_moe", "starcoder2", "olmo2",
                 # types the conformance table (docs/models.md) found no kind for, whose
                 # modules derive without an "other"
                 "aria_text", "diffllama", "ernie4_5_moe", "exaone_moe", "flint", "glm4",
                 "granitemoe_swa", "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3", "hyperclovax",
                 "kolibri1", "minimax_m2", "minimax_m3_vl_text", "nanochat", "moshi", "phi",
                 "persimmon")

# Shrunk sizes; each is set only where the type's config has the attribute.
TINY = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
            num_local_experts=4, num_experts=4, n_routed_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=16, shared_expert_intermediate_size=32, n_shared_experts=1,
            first_k_dense_replace=1, n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=16,
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, intermediate_size_mlp=64,
            decoder_sparse_step=1, mlp_only_layers=[], interleave_moe_layer_step=2,
            rope_scaling=None)

# projection names (of the live model's modules) -> kind, inside attention / a dense MLP
_ATTENTION = {"q_proj": "attn_q", "q_a_proj": "attn_q", "q_b_proj": "attn_q",
              "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_o", "dense": "attn_o",
              "out_proj": "attn_o",
              "qkv_proj": "attn_qkv", "query_key_value": "attn_qkv",
              "kv_a_proj_with_mqa": "attn_kv", "kv_b_proj": "attn_kv"}
_MLP = {"gate_proj": "mlp_gate", "w1": "mlp_gate", "up_proj": "mlp_up", "w3": "mlp_up",
        "c_fc": "mlp_up", "fc1": "mlp_up", "down_proj": "mlp_down", "w2": "mlp_down",
        "c_proj": "mlp_down", "fc2": "mlp_down", "gate_up_proj": "mlp_gate_up",
        "dense_h_to_4h": "mlp_up", "dense_4h_to_h": "mlp_down"}
_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.")
_INDEX = re.compile(r"\.\d+\.")


def tiny_model_config(model_type: str, **overrides):
    """transformers' config of ``model_type`` shrunk to a tiny model (``TINY``, where the config
    has the attribute), untied embeddings."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    kw = {k: v for k, v in TINY.items() if hasattr(default, k) and not (  # nor a read-only one
        isinstance(getattr(type(default), k, None), property)
        and getattr(type(default), k).fset is None)}
    if getattr(default, "kv_lora_rank", None):   # multi-head latent attention: no grouped heads
        kw["num_key_value_heads"] = kw["num_attention_heads"]
    kw.update({k: v for k, v in (("bos_token_id", 1), ("eos_token_id", 2), ("pad_token_id", 0))
               if hasattr(default, k)})
    return AutoConfig.for_model(model_type, **{**kw, "tie_word_embeddings": False, **overrides})


def expert_pattern(rest: str) -> str:
    """A layer-relative name with its numbered parts (expert indices) as ``*``."""
    while True:
        out = _INDEX.sub(".*.", rest)
        if out == rest:
            return out
        rest = out


def _is_norm(module) -> bool:
    return "norm" in type(module).__name__.lower()


def _flow_kinds(model, layer) -> dict[str, str]:
    """The layer's own norms (direct children) by where the data flows in a forward pass."""
    import torch

    attn = next((m for n, m in layer.named_children() if "attention" in type(m).__name__.lower()),
                None)
    ff = next((m for n, m in layer.named_children() if _feed_forward(m)), None)
    seen: dict[str, tuple] = {}

    def hook(name):
        def run(mod, args, kwargs, out):
            x = args[0] if args else kwargs.get("hidden_states")
            seen[name] = (x, out[0] if isinstance(out, tuple) else out)
        return run

    children = [(n, m) for n, m in layer.named_children()
                if _is_norm(m) or m is attn or m is ff]
    handles = [m.register_forward_hook(hook(n), with_kwargs=True) for n, m in children]
    try:
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3, 4]]))
    finally:
        for h in handles:
            h.remove()
    names = {id(m): n for n, m in children}
    a_in, a_out = seen.get(names.get(id(attn)), (None, None))
    f_in, f_out = seen.get(names.get(id(ff)), (None, None))
    out = {}
    for n, m in children:
        if not _is_norm(m) or n not in seen:
            continue
        x, y = seen[n]
        out[n] = ("norm_attn" if y is a_in else "norm_attn_post" if x is a_out else
                  "norm_mlp" if y is f_in else "norm_mlp_post" if x is f_out else "other")
    return out


def _feed_forward(module) -> bool:
    name = type(module).__name__.lower()
    return not _is_norm(module) and "attention" not in name and any(w in name for w in ("mlp", "moe", "feedforward", "experts")) or any(
        type(m).__name__.endswith("Experts") for m in module.modules())


def _kind(layer, rest: str, flow: dict[str, str]) -> str:
    """The kind of the layer's parameter ``rest`` (live name with its .weight/.bias, relative to
    the layer)."""
    parts = rest.split(".")
    chain = [layer]
    for p in parts[:-1]:
        chain.append(getattr(chain[-1], p))
    if len(chain) == 2 and _is_norm(chain[1]):
        return flow.get(parts[0], "other")
    top = chain[1] if len(chain) > 1 else None
    if top is None:
        return "other"
    if "attention" in type(top).__name__.lower():
        if len(chain) == 2:
            return "attn_sinks"
        if _is_norm(chain[2]):
            return "norm_qk"
        return _ATTENTION.get(parts[1], "other")
    if _feed_forward(top):
        if any(type(m).__name__.endswith("Experts") for m in top.modules()):   # a MoE block
            if any(type(m).__name__.endswith("Experts") or
                   (p == "experts" and type(m).__name__ == "ModuleList")
                   for p, m in zip(parts[1:], chain[2:])):
                return "moe_experts"
            if any("router" in type(m).__name__.lower() for m in chain[2:]):
                return "moe_router"
            return "moe_shared"
        return _MLP.get(parts[-2] if len(chain) > 2 else parts[-1], "other")
    return "other"


def derive_kinds(model_type: str, **overrides) -> dict[str, dict[str, str]]:
    """{"layer": {pattern: kind}, "global": {name: kind}} of a model type's checkpoint names
    (no .weight/.bias; layer names relative to the layer, expert numbers as ``*``)."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (WeightConverter, WeightRenaming,
                                                 rename_source_key)

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_model_config(model_type, **overrides)).eval()
    conversions = get_model_conversion_mapping(model)
    renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
    converters = [c for c in conversions if isinstance(c, WeightConverter)]
    live = dict(model.state_dict())
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        names = _saved_names(Path(tmp))
    layers = model.model.layers
    flows = [_flow_kinds(model, layer) for layer in layers]
    out: dict[str, dict[str, str]] = {"layer": {}, "global": {}}
    for name in sorted(names):
        base = _strip(name)
        target, _ = rename_source_key(name, renamings, converters, model.base_model_prefix, live)
        m, lm = _LAYER.match(base), _LAYER.match(target)
        if m is None:
            out["global"][base] = _global_kind(base)
            continue
        i = int(lm.group(1))
        kind = _kind(layers[i], target[lm.end():], flows[i])
        if kind.startswith("moe_") and "." not in _strip(base[m.end():]) and \
                _is_norm(_module(layers[i], target[lm.end():])):
            # a norm the checkpoint stores as the layer's own (axk1's post_mlp_layernorm) that
            # transformers moves into the MoE block to normalise its output: a layer norm after
            # the feed-forward, as the checkpoint says, not a part of the experts' block
            kind = "norm_mlp_post"
        key = expert_pattern(base[m.end():])
        if out["layer"].setdefault(key, kind) != kind:
            raise ValueError(f"{model_type}: {key} is {out['layer'][key]} in one layer and "
                             f"{kind} in another")
    return out


def _saved_names(folder: Path) -> list[str]:
    """The tensor names of the safetensors files ``save_pretrained`` wrote (headers only)."""
    from safetensors import safe_open

    names = []
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as st:
            names += list(st.keys())
    return names


def known_to_transformers(model_type: str) -> bool:
    """Whether the installed transformers has a config class for ``model_type``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return model_type in CONFIG_MAPPING_NAMES


def derive_at_run_time(model_type: str) -> tuple[dict[str, dict[str, str]] | None, str]:
    """(``derive_kinds(model_type)``, "") for a type the installed transformers knows, else
    (None, why not). The derivation's tiny model is seeded: the caller's random state is kept;
    transformers' warnings and progress bars about the tiny model are not the user's."""
    import torch
    from transformers.utils import logging as hf_logging

    if not known_to_transformers(model_type):
        return None, f"the installed transformers does not know the model type {model_type!r}"
    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with torch.random.fork_rng(devices=[]):
            return derive_kinds(model_type), ""
    except Exception as e:  # noqa: BLE001 - a tiny model that does not build or run: no kinds
        return None, f"transformers' tiny {model_type} model did not derive: {str(e)[:120]}"
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _module(layer, rest: str):
    """The module that holds the layer's parameter ``rest`` (live name)."""
    module = layer
    for p in rest.split(".")[:-1]:
        module = getattr(module, p)
    return module


def _strip(name: str) -> str:
    for s in (".weight", ".bias"):
        if name.endswith(s):
            return name[: -len(s)]
    return name


def _global_kind(base: str) -> str:
    return ("embed" if base.endswith("embed_tokens") else "lm_head" if base == "lm_head" else
            "final_norm" if base.endswith((".norm", ".final_layernorm")) else "other")


def table_source(types=DERIVED_TYPES) -> str:
    """The text of ``kinds_table.py``."""
    import transformers

    lines = ['"""The kinds of the checkpoint names of a few model types (layer names relative to the layer, '
             'expert numbers', 'as `*`), generated by `python -m layerswap_core.checkpoints.derive_kinds` from transformers '
             f'{transformers.__version__}', "(see derive_kinds.py); tests/test_model_families.py "
             'derives it again and compares. Do not edit."""', "", "KINDS = {"]
    for t in types:
        d = derive_kinds(t)
        lines.append(f"    {t!r}: {{")
        for part in ("layer", "global"):
            lines.append(f"        {part!r}: {{")
            lines += [f"            {k!r}: {v!r}," for k, v in d[part].items()]
            lines.append("        },")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    (Path(__file__).with_name("kinds_table.py")).write_text(table_source())
