"""Architecture knowledge as data: parameter name -> (layer index, module kind).

Every family is one entry of ``FAMILIES``: the regex that finds a decoder layer's index,
the per-layer suffixes and their kinds, and the non-layer names. Adding a family means adding
one entry here; no other module knows how parameters are named. The families of the model types
in ``kinds_table.KINDS`` (mixture-of-experts models, starcoder2, OLMo 2) are that table, derived
from transformers' own modules by ``derive_kinds`` (and checked against it by the tests); the
others are written by hand. A model type in neither but known to the installed transformers is
derived the same way when a model of it is first opened (``run_time_family``: torch and
transformers imported then, about 1 s per type once they are); any other falls back to a
generic regex and says so.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from .derive_kinds import derive_at_run_time
from .kinds_table import KINDS as DERIVED_KINDS

# Module kinds and the groups that merge rules and heatmaps select by. A mixture-of-experts
# block is the layer's feed-forward: its experts, its router (weight, bias, score correction)
# and its shared experts (with their gate) are in the ``mlp`` group, each also a kind of its own.
# ``attn_kv``: multi-head latent attention's key/value projections (DeepSeek-V3); ``attn_sinks``:
# the attention's own per-head parameters (gpt-oss's sinks).
ATTENTION_KINDS = ("attn_q", "attn_k", "attn_v", "attn_o", "attn_qkv", "attn_kv", "attn_sinks",
                   "norm_qk")
MOE_KINDS = ("moe_router", "moe_experts", "moe_shared")
MLP_KINDS = ("mlp_gate", "mlp_up", "mlp_down", "mlp_gate_up") + MOE_KINDS
NORM_KINDS = ("norm_attn", "norm_attn_post", "norm_mlp", "norm_mlp_post", "norm_qk")
# The linear projections of a layer (what LoRA adapts and what adapter extraction cuts).
PROJECTION_KINDS = ("attn_q", "attn_k", "attn_v", "attn_o", "attn_qkv", "attn_kv",
                    "mlp_gate", "mlp_up", "mlp_down", "mlp_gate_up")
# The projections of one layer that read the same input: one product can compute them together
# (inference.products stacks their weights for decoding).
SHARED_INPUT_KINDS = (("attn_q", "attn_k", "attn_v"), ("mlp_gate", "mlp_up"))
KIND_GROUPS = {
    "attention": ATTENTION_KINDS,
    "mlp": MLP_KINDS,
    "norm": NORM_KINDS,
}
# Display order for heatmaps (layer x kind).
LAYER_KIND_ORDER = (
    "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_kv", "attn_o", "attn_sinks", "norm_qk",
    "mlp_gate", "mlp_up", "mlp_gate_up", "mlp_down", "moe_router", "moe_experts", "moe_shared",
    "norm_attn", "norm_attn_post", "norm_mlp", "norm_mlp_post", "other",
)


# A multimodal wrapper's parts that are not the decoder (gemma3's Gemma3ForConditionalGeneration:
# ``model.vision_tower.*``, ``model.multi_modal_projector.*``): kind ``vision``, outside every
# layer; every merge keeps them from the task expert (``merge.plan.build_plan``).
VISION_PREFIXES = ("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
                   "multi_modal_projector.", "model.vision_model.", "vision_model.")


class ParamInfo(NamedTuple):
    layer: int | None  # decoder layer index, None for embeddings / final norm / head
    kind: str          # one of the kinds above, or "other"


_LLAMA_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_o",
    "self_attn.q_norm": "norm_qk",
    "self_attn.k_norm": "norm_qk",
    "mlp.gate_proj": "mlp_gate",
    "mlp.up_proj": "mlp_up",
    "mlp.down_proj": "mlp_down",
    "input_layernorm": "norm_attn",
    "post_attention_layernorm": "norm_mlp",
}
_LLAMA_GLOBAL = {
    "model.embed_tokens": "embed",
    "model.norm": "final_norm",
    "lm_head": "lm_head",
}
_GEMMA2_LAYER = {
    **_LLAMA_LAYER,
    # Gemma 2/3 wrap both sub-blocks in pre- and post-norms.
    "post_attention_layernorm": "norm_attn_post",
    "pre_feedforward_layernorm": "norm_mlp",
    "post_feedforward_layernorm": "norm_mlp_post",
}


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    layer_pattern: str                      # regex with one group: the layer index
    layer_kinds: dict[str, str]             # suffix (no .weight/.bias) -> kind
    global_kinds: dict[str, str]            # full name (no .weight/.bias) -> kind
    num_layers_keys: tuple[str, ...] = ("num_hidden_layers",)
    fallback: bool = False
    run_time: bool = False                  # derived from transformers when first opened
    _rx: re.Pattern = field(init=False, repr=False, compare=False)
    _numbered: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_rx", re.compile(self.layer_pattern))
        # suffixes with numbered parts (experts.*.w1): a name's numbers are looked up as ``*``
        object.__setattr__(self, "_numbered", any("*" in k for k in self.layer_kinds))

    def layer_kind(self, rest: str) -> str | None:
        """The kind of a layer-relative name (no .weight/.bias), None when the table lacks it."""
        kind = self.layer_kinds.get(rest)
        if kind is None and self._numbered:
            kind = self.layer_kinds.get(_NUMBER.sub(".*.", _NUMBER.sub(".*.", rest)))
        return kind


_NUMBER = re.compile(r"\.\d+\.")
# a routed expert's number in a checkpoint name: mixtral's block_sparse_moe.experts.3.w1,
# qwen's mlp.experts.3.gate_proj (the only numbered parts of the derived table's patterns)
_EXPERT_NUMBER = re.compile(r"\.experts\.(\d+)\.")


FAMILIES: list[Family] = [
    Family("llama", ("llama", "mistral", "qwen2", "qwen3", "olmo", "granite",
                     "smollm3", "internlm2", "yi"),
           r"^(?:model\.)?layers\.(\d+)\.", _LLAMA_LAYER, _LLAMA_GLOBAL),
    Family("gemma", ("gemma",), r"^(?:model\.)?layers\.(\d+)\.", _LLAMA_LAYER, _LLAMA_GLOBAL),
    # gemma3's multimodal wrapper: its decoder as transformers 5 names it live
    # (model.language_model.*) and as its checkpoints store it (language_model.model.*)
    Family("gemma2", ("gemma2", "gemma3", "gemma3_text"),
           r"^(?:model\.(?:language_model\.)?|language_model\.model\.)?layers\.(\d+)\.",
           _GEMMA2_LAYER,
           {**_LLAMA_GLOBAL, "model.language_model.embed_tokens": "embed",
            "model.language_model.norm": "final_norm",
            "language_model.model.embed_tokens": "embed",
            "language_model.model.norm": "final_norm", "language_model.lm_head": "lm_head"}),
    Family("cohere", ("cohere", "cohere2"), r"^(?:model\.)?layers\.(\d+)\.",
           {**_LLAMA_LAYER}, _LLAMA_GLOBAL),  # parallel block: input_layernorm only
    Family("phi3", ("phi3",), r"^(?:model\.)?layers\.(\d+)\.",
           {**_LLAMA_LAYER, "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "mlp_gate_up"},
           _LLAMA_GLOBAL),
    Family("gpt_neox", ("gpt_neox",), r"^(?:gpt_neox\.)?layers\.(\d+)\.",
           {"attention.query_key_value": "attn_qkv", "attention.dense": "attn_o",
            "mlp.dense_h_to_4h": "mlp_up", "mlp.dense_4h_to_h": "mlp_down",
            "input_layernorm": "norm_attn", "post_attention_layernorm": "norm_mlp"},
           {"gpt_neox.embed_in": "embed", "gpt_neox.final_layer_norm": "final_norm",
            "embed_out": "lm_head"}),
    Family("falcon", ("falcon", "RefinedWeb", "RefinedWebModel"), r"^(?:transformer\.)?h\.(\d+)\.",
           {"self_attention.query_key_value": "attn_qkv", "self_attention.dense": "attn_o",
            "mlp.dense_h_to_4h": "mlp_up", "mlp.dense_4h_to_h": "mlp_down",
            "input_layernorm": "norm_attn", "post_attention_layernorm": "norm_mlp",
            "ln_attn": "norm_attn", "ln_mlp": "norm_mlp"},
           {"transformer.word_embeddings": "embed", "transformer.ln_f": "final_norm",
            "lm_head": "lm_head"},
           num_layers_keys=("num_hidden_layers", "n_layer")),
] + [Family(model_type, (model_type,), r"^(?:model\.)?layers\.(\d+)\.", table["layer"],
            {**_LLAMA_GLOBAL, **table["global"]})
     for model_type, table in DERIVED_KINDS.items()]

FALLBACK = Family("unknown", (), r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.", {}, {},
                  num_layers_keys=("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
                  fallback=True)
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}


@functools.cache
def run_time_family(model_type: str) -> tuple[Family | None, str]:
    """(the family of a model type the table lacks, derived from the installed transformers'
    own modules as the table is (``derive_kinds.derive_at_run_time``), "") or (None, why not).
    Names its modules give no kind are guessed as the generic fallback guesses them."""
    table, why = derive_at_run_time(model_type)
    if table is None:
        return None, why
    known = {part: {k: v for k, v in table[part].items() if v != "other"}
             for part in ("layer", "global")}
    return Family(model_type, (model_type,), r"^(?:model\.)?layers\.(\d+)\.", known["layer"],
                  {**_LLAMA_GLOBAL, **known["global"]}, run_time=True), ""
_SUFFIXES = (".weight", ".bias")


def _strip(name: str) -> str:
    for s in _SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def text_config(config: dict) -> dict:
    """Multimodal configs keep the decoder under text_config."""
    tc = config.get("text_config")
    return tc if isinstance(tc, dict) and "num_hidden_layers" in tc else config


def tied_embeddings(config: dict) -> bool:
    """The one tied-embedding rule: ``tie_word_embeddings`` of the decoder's config (text_config
    for multimodal ones), else of the top-level config; absent means untied."""
    return bool(text_config(config).get("tie_word_embeddings",
                                        config.get("tie_word_embeddings", False)))


# config keys of a mixture-of-experts model: its routed experts, and how many each token uses
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
ACTIVE_EXPERT_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "top_k")


@dataclass(frozen=True)
class Architecture:
    family: Family
    model_type: str
    num_layers: int
    experts: int | None = None          # routed experts per MoE layer (None: a dense model)
    active_experts: int | None = None   # experts each token is routed to

    @property
    def name(self) -> str:
        return self.family.name

    @property
    def is_fallback(self) -> bool:
        return self.family.fallback

    def classify(self, name: str) -> ParamInfo:
        return classify(name, self.family)

    def moe(self) -> str:
        """"" for a dense model, else "MoE: N experts, K active"."""
        if not self.experts:
            return ""
        active = f", {self.active_experts} active" if self.active_experts else ""
        return f"MoE: {self.experts} experts{active}"

    def expert(self, name: str) -> int | None:
        """The routed expert's number in a checkpoint name (``...experts.3.w1.weight``: 3), None
        for any other tensor and for a tensor holding all of a layer's experts."""
        if self.classify(name).kind != "moe_experts":
            return None
        m = _EXPERT_NUMBER.search(name)
        return int(m.group(1)) if m else None

    def unclassified(self, names) -> list[str]:
        """The names no kind rule can address (kind "other"), in the given order."""
        return [n for n in names if self.classify(n).kind == "other"]

    def vision(self, names) -> list[str]:
        """The names of a multimodal wrapper's vision tower and projector (kind "vision")."""
        return [n for n in names if self.classify(n).kind == "vision"]

    def describe(self) -> str:
        note = " (unknown family: layer index found by the generic `layers.N.`/`h.N.` regex)" \
            if self.is_fallback else " (kinds derived from transformers' modules at run time)" \
            if self.family.run_time else ""
        moe = f", {self.moe()}" if self.experts else ""
        return f"{self.model_type} [{self.family.name}], {self.num_layers} layers{moe}{note}"


def classify(name: str, family: Family = FAMILIES[0]) -> ParamInfo:
    """(layer index or None, module kind) of one parameter name."""
    base = _strip(name)
    if base.startswith(VISION_PREFIXES):
        return ParamInfo(None, "vision")
    m = family._rx.search(base)
    if m:
        rest = base[m.end():]
        kind = family.layer_kind(rest)
        if kind is None and (family.fallback or family.run_time):
            kind = _guess_kind(rest)
        return ParamInfo(int(m.group(1)), kind or "other")
    kind = family.global_kinds.get(base)
    if kind is None:
        kind = _guess_global(base)
    return ParamInfo(None, kind)


def _guess_kind(rest: str) -> str:
    """Best effort for unknown families: well-known suffixes of other families."""
    for fam in FAMILIES:
        kind = fam.layer_kind(rest)
        if kind is not None:
            return kind
    return "other"


def _guess_global(base: str) -> str:
    for fam in FAMILIES:
        if base in fam.global_kinds:
            return fam.global_kinds[base]
    low = base.lower()
    if "embed" in low and "pos" not in low:
        return "embed"
    if low.endswith(("lm_head", "embed_out")):
        return "lm_head"
    if low.endswith(("norm", "ln_f")):
        return "final_norm"
    return "other"


def get_architecture(config: dict) -> Architecture:
    """Architecture of a model from its config.json contents (a dict)."""
    tc = text_config(config)
    model_type = tc.get("model_type") or config.get("model_type") or "unknown"
    family = _BY_TYPE.get(model_type)
    if family is None and isinstance(model_type, str) and model_type != "unknown":
        family = run_time_family(model_type)[0]
    family = family or FALLBACK
    experts = next((tc[k] for k in EXPERT_KEYS if isinstance(tc.get(k), int) and tc[k] > 1), None)
    active = next((tc[k] for k in ACTIVE_EXPERT_KEYS if isinstance(tc.get(k), int)), None)
    for key in family.num_layers_keys + FALLBACK.num_layers_keys:
        if isinstance(tc.get(key), int):
            return Architecture(family, model_type, tc[key], experts, active if experts else None)
    raise ValueError(f"cannot find the number of layers in the config of a {model_type!r} model "
                     f"(looked for {', '.join(FALLBACK.num_layers_keys)})")


def param_names_from_config(config: dict) -> list[str]:
    """Parameter names a config implies, built on the meta device (no memory, no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config) if "model_type" in config else config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    names = [n for n, _ in model.named_parameters()]
    if tied_embeddings(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg):
        names = [n for n in names if _strip(n) not in ("lm_head", "embed_out")]
    return names
