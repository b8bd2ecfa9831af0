"""The conformance run of one model type (issue #65): a tiny random trio made from transformers'
own config class by one generic shrinking step, then every path a user's trio takes, each step
said "yes" or, where it fails, the one-line reason. ``tests/test_conformance.py`` runs it for the
named types (``make test``) or for every decoder-only causal-LM type of the pinned transformers
(``make conformance``, which also writes the table into docs/models.md and the count into the
README).

The reference merges are the test's own: plain torch over the checkpoints' tensors, classified
by this file's name patterns (``FEED_FORWARD``, ``VISION``), not by layerswap's kind table.
"""
from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from layerswap_core.checkpoints.derive_kinds import TINY
from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.checkpoints.references import DEFAULT_BASE, resolve
from layerswap_core.testing import copy_tokenizer, make_expert

# The named types: they run in `make test` and must pass every step.
NAMED = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gemma3", "olmo2",
         "cohere2", "phi3", "granite", "starcoder2", "smollm3", "mixtral", "qwen2_moe",
         "qwen3_moe", "gpt_oss", "deepseek_v3", "llama4_text", "granitemoe", "glm4_moe")
STEPS = ("check", "deltas", "methods", "kinds mlp", "disk = reference", "live = disk", "save")
METHODS = ("layer_swap", "soup", "task_arithmetic", "ties", "magnitude_soup")

# The generic shrinking step: derive_kinds' TINY sizes, the same sizes under other configs'
# names, and a tiny vision tower for multimodal wrappers; each set only where the config (or
# sub-config) has the attribute.
OTHER_NAMES = dict(n_layer=2, num_layers=2, n_layers=2, n_embd=32, d_model=32, n_head=4,
                   num_heads=4, n_heads=4, n_inner=64, ffn_dim=64, n_positions=64,
                   n_ctx=64, max_seq_len=64, seq_length=64, num_kv_heads=2, kv_channels=8,
                   ffn_hidden_size=64, moe_topk=2, num_experts_per_token=2, top_k=2,
                   moe_num_experts=4, rotary_dim=8)
VISION = dict(image_size=28, patch_size=14, mm_tokens_per_image=4)
MAX_PARAMS = 3_000_000
IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])

# The test's own idea of a decoder's parts, from checkpoint names: a layer, its feed-forward
# block (a dense MLP or a MoE block: experts, router, shared experts), a wrapper's vision tower.
LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")
FEED_FORWARD = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.\d+\.(?:mlp|block_sparse_moe|"
                          r"feed_forward|ffn|moe|mixer_mlp)\.")
ATTENTION = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.\d+\.(?:self_attn|attn|attention|"
                       r"self_attention)\.")
VISION_PART = re.compile(r"(?:^|\.)(?:vision_tower|multi_modal_projector|vision_model)\.")


def _settable(config, key: str) -> bool:
    prop = getattr(type(config), key, None)
    return hasattr(config, key) and not (isinstance(prop, property) and prop.fset is None)


def _shrunk(default, extra=()) -> dict:
    sizes = {**OTHER_NAMES, **TINY, **dict(extra)}
    out = {k: v for k, v in sizes.items() if _settable(default, k)}
    kinds = getattr(default, "layer_types", None)
    if isinstance(kinds, (list, tuple)) and len(kinds) > 2:   # a hybrid's pattern, cut to 2
        other = next((k for k in kinds if k != kinds[0]), kinds[1])
        out["layer_types"] = [kinds[0], other]
    return out


# what a sub-config derives from its sizes (rebuilt, not copied from the full-size default)
_REGENERATED = ("layer_types", "architectures", "transformers_version", "_name_or_path",
                "rope_scaling", "rope_parameters", "sliding_window_pattern")


def _per_layer_type(rope) -> bool:
    return isinstance(rope, dict) and bool(rope) and all(isinstance(v, dict) for v in rope.values())


def tiny_config(model_type: str):
    """transformers' config of ``model_type`` shrunk (module docstring), untied embeddings."""
    from transformers import AutoConfig

    from layerswap_core.checkpoints.derive_kinds import tiny_model_config

    default = AutoConfig.for_model(model_type)
    kw = {k: v for k, v in _shrunk(default, VISION).items() if k not in TINY}
    if _per_layer_type(getattr(default, "rope_parameters", None)):
        kw["rope_scaling"] = default.rope_parameters   # TINY's None would drop every layer's
    for key in getattr(default, "sub_configs", None) or {}:
        sub = getattr(default, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            kept = {k: v for k, v in sub.to_dict().items() if k not in _REGENERATED}
            kw[key] = {**kept, "model_type": sub.model_type, "tie_word_embeddings": False,
                       **_shrunk(sub, VISION if "vision" in key else ())}
            if hasattr(sub, "vocab_size"):   # token ids within the tiny vocabulary
                kw[key].update({k: v for k, v in (("bos_token_id", 1), ("eos_token_id", 2),
                                                  ("pad_token_id", 0)) if hasattr(sub, k)})
            if getattr(sub, "kv_lora_rank", None):
                kw[key]["num_key_value_heads"] = kw[key]["num_attention_heads"]
    return tiny_model_config(model_type, **kw)


def tensors(folder) -> dict[str, torch.Tensor]:
    r = CheckpointReader(folder)
    return {n: r.get(n) for n in r.names()}


def make_trio(root: Path, model_type: str) -> dict[str, Path]:
    """base (random, seeded) + two experts with every tensor perturbed differently."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type)
    with torch.device("meta"):   # a config the generic step did not shrink is not built
        size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    if size > MAX_PARAMS:
        raise ValueError(f"the generic shrinking step leaves {size / 1e6:.1f} M parameters "
                         "(sizes under names it does not know)")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.08)
        assert torch.isfinite(model(IDS).logits).all(), "the tiny model's logits are not finite"
    model.save_pretrained(root / "base")
    copy_tokenizer(resolve(DEFAULT_BASE), root / "base")
    return {"base": root / "base",
            **{role: make_expert(root / "base", root / role, seed=seed, default_scale=0.3,
                                 global_scale=0.3)
               for role, seed in (("task", 1), ("lang", 2))}}


def logits(folder) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(IDS).logits


def _reference(paths, out: Path, pick) -> Path:
    """A merge done by hand: ``pick(name, task, lang, base)`` of every tensor, saved beside the
    task expert's config."""
    t, g, b = (tensors(paths[r]) for r in ("task", "lang", "base"))
    out.mkdir()
    shutil.copy2(paths["task"] / "config.json", out / "config.json")
    save_file({n: pick(n, t[n], g[n], b[n]).contiguous() for n in t}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) < 160 else text[:157] + "..."


def run(model_type: str, root: Path) -> dict:
    """Every step of one type: {"family", "moe", "seconds", step: "yes" or the reason}."""
    from layerswap_core.analysis.deltas import delta_stats
    from layerswap_core.checkpoints.compatibility import checked_models, open_models
    from layerswap_core.checkpoints.preflight import check
    from layerswap_core.merge.config import MergeConfig
    from layerswap_core.merge.executor import merge_to_folder
    from layerswap_core.merge.live import LiveModel

    t0 = time.perf_counter()
    out: dict = {"family": "", "moe": ""}
    try:
        paths = make_trio(root, model_type)
    except Exception as e:  # noqa: BLE001 - the type's own tiny model: its reason is the row
        return {**out, "tiny model": _one_line(e), "seconds": time.perf_counter() - t0}
    refs = [str(paths[r]) for r in ("base", "task", "lang")]

    def step(name, fn):
        try:
            fn()
            out[name] = "yes"
        except Exception as e:  # noqa: BLE001 - each step's failure is said, the rest still runs
            out[name] = _one_line(e)

    def _check():
        pf = check(*refs)
        info = pf.models["task"].info
        out["family"], out["moe"] = info.family, info.moe or "dense"
        assert pf.ok, pf.refusal
        warnings = [line for line in pf.lines() if line.startswith("warning:")]
        assert not warnings, warnings[0]
        if VISION_PART.search(" ".join(tensors(paths["base"]))):
            assert any("vision tower and projector" in line for line in pf.lines()), \
                "check does not say what happens to the vision tower"

    def _deltas():
        st = delta_stats(paths["base"], paths["task"], cache=False)
        assert st.tensors and "other" not in st.kinds(), f"kinds {sorted(st.kinds())}"

    disk = {}

    def _methods():
        t, g, b = (tensors(paths[r]) for r in ("task", "lang", "base"))
        for method in METHODS:
            folder = merge_to_folder(MergeConfig(method=method), task=paths["task"],
                                     lang=paths["lang"], base=paths["base"],
                                     out=root / f"m-{method}")
            merged = tensors(folder)
            for n, x in merged.items():   # the test's own arithmetic of the linear methods
                if VISION_PART.search(n):
                    want = t[n]
                elif method == "soup":
                    want = (t[n] + g[n]) / 2
                elif method == "task_arithmetic":
                    want = b[n] + (t[n] - b[n]) + (g[n] - b[n])
                else:
                    continue
                assert torch.allclose(x, want, atol=1e-6), f"{method}: {n}"
            got = disk[method] = logits(folder)
            assert torch.isfinite(got).all(), f"{method}: logits not finite"

    mlp = MergeConfig(partition=[{"layers": "0-1", "kinds": "mlp"}], non_layer="task")

    def _kinds():
        folder = merge_to_folder(mlp, task=paths["task"], lang=paths["lang"],
                                 out=root / "m-mlp")
        merged, t, g = tensors(folder), tensors(paths["task"]), tensors(paths["lang"])
        ff = [n for n in merged if FEED_FORWARD.search(n) and not VISION_PART.search(n)]
        assert {int(LAYER.search(n).group(1)) for n in ff} == {0, 1}, "no feed-forward found"
        for n in merged:
            src = g if n in ff else t
            assert torch.equal(merged[n], src[n]), \
                f"{n} not from the {'language' if n in ff else 'task'} expert"

    def _disk():
        def pick(n, t, g, b):
            return g if FEED_FORWARD.search(n) and not VISION_PART.search(n) else t
        ref = _reference(paths, root / "ref-mlp", pick)
        got = disk["mlp"] = logits(root / "m-mlp")
        assert torch.equal(got, logits(ref)), "the merge's logits differ from the hand merge's"

    def _live():
        live = LiveModel.from_refs(paths["task"], paths["lang"], paths["base"])
        for key, cfg in (("layer_swap", MergeConfig()), ("mlp", mlp)):
            live.show(cfg)
            with torch.no_grad():
                assert torch.equal(live.model(IDS).logits, disk[key]), f"live {key}"

    def _save():
        models = open_models({r: paths[r] for r in ("task", "lang", "base")})
        folder = merge_to_folder(mlp, task=paths["task"], lang=paths["lang"],
                                 base=paths["base"], out=root / "saved", shard_size="64KB",
                                 checked=checked_models(models))
        assert torch.equal(logits(folder), disk["mlp"]), "the saved merge's logits differ"

    for name, fn in zip(STEPS, (_check, _deltas, _methods, _kinds, _disk, _live, _save)):
        if name in ("disk = reference", "save") and out.get("kinds mlp") != "yes":
            out[name] = "needs kinds mlp"
        elif name == "live = disk" and not {"layer_swap", "mlp"} <= set(disk):
            out[name] = "needs the disk merges"
        else:
            step(name, fn)
    out["seconds"] = time.perf_counter() - t0
    return out


def causal_lm_types() -> list[str]:
    """Every model type with a causal-LM class in the pinned transformers, minus encoders that
    can also decode (types with a masked-LM class: BERT, RoBERTa...) and encoder-decoders."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    out = []
    for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        if t in MODEL_FOR_MASKED_LM_MAPPING_NAMES and t not in NAMED:
            continue
        try:
            if getattr(AutoConfig.for_model(t), "is_encoder_decoder", False):
                continue
        except Exception:  # noqa: BLE001 - listed, and its tiny model says why it fails
            pass
        out.append(t)
    return out


def passed(row: dict) -> bool:
    return all(row.get(s) == "yes" for s in STEPS)


def table(rows: dict[str, dict]) -> str:
    """The markdown table of the runs (type, family, dense/MoE, steps), passes first."""
    head = "| type | family | dense / MoE | " + " | ".join(STEPS) + " |"
    lines = [head, "|" + "---|" * (3 + len(STEPS))]
    order = sorted(rows, key=lambda t: (not passed(rows[t]), t not in NAMED, t))
    for t in order:
        r = rows[t]
        if "tiny model" in r:
            cells = [f"tiny model does not run: {r['tiny model']}"] + [""] * (len(STEPS) - 1)
        else:
            cells = [r.get(s, "") for s in STEPS]
        cells = [c.replace("|", "\\|") for c in cells]
        lines.append(f"| {t} | {r.get('family', '')} | {r.get('moe', '')} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)
