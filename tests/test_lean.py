"""The lean Llama (inference.lean) against transformers' own LlamaForCausalLM and tokenizer:
the same ids, text, logits bit for bit, generations and NLLs; what keeps a checkpoint off it;
and an evaluation run that never imports transformers."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys

import pytest
import torch

from layerswap_core.checkpoints.loading import load_model
from layerswap_core.checkpoints.tokenizers import encode_prompt
from layerswap_core.inference.attention import packed_attention
from layerswap_core.inference.generation import generate
from layerswap_core.inference.lean import (LeanLlama, lean_reason, load_lean,
                                            load_lean_model)
from layerswap_core.inference.prefill import cache_classes
from layerswap_core.inference.products import packed_products, split_head
from layerswap_core.inference.stops import pad_id
from layerswap_core.evaluation.runner import gold_nll

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = [
    "Question: Janet's ducks lay 16 eggs per day. She eats three for breakfast.\nAnswer:",
    "Swali: Bata wa Janet hutaga mayai 16 kila siku.\nJibu:",
    "প্রশ্ন: জ্যানেটের হাঁসগুলি প্রতিদিন 16টি করে ডিম পাড়ে।",
    "ప్రశ్న: 3 + 4?  <|im_end|> tabs\tand  spaces  ",
    "12 + 7 = 19. <|im_start|>assistant\n",
    "",
]


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    from layerswap_core.testing import make_tiny_model
    return make_tiny_model(tmp_path_factory.mktemp("untied"), seed=3, num_layers=3, tie=False)


def _pair(folder):
    return load_model(str(folder)), load_lean(folder)


def test_the_embedded_and_tiny_llamas_are_lean_and_others_say_why_not(embedded_base, tiny,
                                                                       tmp_path):
    assert lean_reason(embedded_base) is None and lean_reason(tiny["base"]) is None
    assert lean_reason(tiny["base"], device="cuda").startswith("device cuda")

    def variant(name, config=None, tokenizer=None, generation=None):
        folder = tmp_path / name
        shutil.copytree(tiny["base"], folder)
        for file, change in (("config.json", config), ("tokenizer_config.json", tokenizer),
                             ("generation_config.json", generation)):
            if change:
                data = json.loads((folder / file).read_text()) if (folder / file).exists() else {}
                data.update(change)
                (folder / file).write_text(json.dumps(data))
        return lean_reason(folder)

    assert "qwen2" in variant("qwen", {"model_type": "qwen2"})
    assert "attention_bias" in variant("bias", {"attention_bias": True})
    assert "rotary" in variant("rope", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0,
                                                             "rope_theta": 5e5}})
    assert "hidden_act" in variant("gelu", {"hidden_act": "gelu"})
    assert "add_bos_token" in variant("bos", tokenizer={"add_bos_token": True})
    assert "LlamaTokenizer" in variant("cls", tokenizer={"tokenizer_class": "LlamaTokenizer"})
    assert "repetition_penalty" in variant("rep", generation={"repetition_penalty": 1.2})
    assert "pad token '<pad>'" in variant("pad", tokenizer={"pad_token": "<pad>"})
    assert "bos token 'Hello'" in variant("bos2", tokenizer={"bos_token": "Hello"})
    assert variant("theta", {"rope_parameters": {"rope_type": "default",
                                                 "rope_theta": 5e5}}) is None


def test_tokenizer_gives_transformers_ids_and_text(embedded_base):
    from layerswap_core.checkpoints.loading import load_tokenizer
    hf, lean = load_tokenizer(embedded_base), load_lean(embedded_base)[1]
    for role in ("bos", "eos", "pad", "unk"):
        assert getattr(lean, f"{role}_token_id") == getattr(hf, f"{role}_token_id")
    for text in TEXTS:
        for special in (True, False):
            assert (lean(text, add_special_tokens=special)["input_ids"]
                    == hf(text, add_special_tokens=special)["input_ids"])
        ids = hf(text)["input_ids"]
        for skip in (True, False):
            assert lean.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip)
    rng = random.Random(0)
    rows = [[rng.randrange(len(hf)) for _ in range(rng.randrange(1, 12))] for _ in range(200)]
    rows += [[0, 1, 2, 17, 2], [2], [300, 2, 301]]
    for skip in (True, False):
        assert lean.batch_decode(rows, skip_special_tokens=skip) == hf.batch_decode(
            rows, skip_special_tokens=skip)


def _passes(model):
    """Logits of the kinds of pass evaluation makes: a whole prompt (no cache), a padded
    multi-token pass over a cache, one token per row with padding, with and without the packed
    attention and products of decoding."""
    torch.manual_seed(0)
    v = model.config.vocab_size
    prompt = torch.randint(3, v, (2, 9))
    out = []
    with torch.inference_mode():
        first = model(input_ids=prompt, use_cache=True)
        out.append(first.logits)
        kv = [(layer.keys, layer.values) for layer in first.past_key_values.layers]
        cache_cls = cache_classes(model)[0]
        for packed in (False, True):
            cache = cache_cls(ddp_cache_data=kv)
            ids = torch.randint(3, v, (2, 3))
            mask = torch.ones(2, 12, dtype=torch.long)
            mask[1, 3:5] = 0                         # a hole in row 1's keys (drafts not kept)
            mask[0, 11] = 0                          # row 0 feeds one token fewer
            pos = torch.tensor([[9, 10, 11], [7, 8, 9]])
            with (packed_products(model) if packed else torch.no_grad()), \
                    packed_attention(model), split_head(model):
                multi = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                              past_key_values=cache, use_cache=True, logits_to_keep=3)
                one = model(input_ids=ids[:, :1], attention_mask=mask[:, :10],
                            position_ids=pos[:, :1], past_key_values=cache_cls(ddp_cache_data=kv),
                            use_cache=True, logits_to_keep=1)
            out += [multi.logits, one.logits]
    return out


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_logits_equal_transformers_bit_for_bit(which, tiny, untied):
    folder = tiny["base"] if which == "tied" else untied
    (hf, _), (lean, _) = _pair(folder)
    assert isinstance(lean, LeanLlama)
    assert (lean.lm_head.weight is lean.model.embed_tokens.weight) == (which == "tied")
    assert sorted(n for n, _ in lean.named_parameters()) == sorted(
        n for n, _ in hf.named_parameters())
    for a, b in zip(_passes(hf), _passes(lean)):
        assert a.shape == b.shape and torch.equal(a, b)


def test_generation_and_nll_equal_transformers(embedded_base, mgsm_prompts):
    (hf, hf_tok), (lean, tok) = _pair(embedded_base)
    prompts, targets = mgsm_prompts
    kw = dict(max_new_tokens=24, stop=["Question:", "</s>", "<|im_end|>"], batch_size=3)
    a = generate(hf, hf_tok, prompts, **kw)
    b = generate(lean, tok, prompts, **kw)
    assert [g.text for g in a] == [g.text for g in b]
    assert [g.num_tokens for g in a] == [g.num_tokens for g in b]
    assert len({g.text for g in b}) > 1
    assert gold_nll(hf, hf_tok, prompts, targets) == gold_nll(lean, tok, prompts, targets)
    # prompts of one token, no shared prefix: the cache starts empty, shaped by a pass over one
    # pad token (``decoding.refill_decode``); both equal transformers' own greedy generate
    short = ["", "Hello", "7"]
    a, b = (generate(m, k, short, max_new_tokens=8, batch_size=3) for m, k in ((hf, hf_tok),
                                                                               (lean, tok)))
    assert a == b
    for g, p in zip(a, short):
        start = hf_tok.bos_token_id if hf_tok.bos_token_id is not None else pad_id(hf_tok)
        ids = torch.tensor([encode_prompt(hf_tok, p) or [start]])
        out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=8, temperature=None, top_p=None, top_k=None,
                          pad_token_id=hf_tok.eos_token_id)
        assert g.text == hf_tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.fixture(scope="module")
def mgsm_prompts():
    """Five MGSM chain-of-thought prompts (2 exemplars) and gold-like targets."""
    from layerswap_core.evaluation.data import load_mgsm
    from layerswap_core.evaluation.runner import default_exemplars, side_by_side_task
    items = load_mgsm("en", None)[:5]
    task = side_by_side_task(items, default_exemplars(items, 2, cot=True, data_dir=None),
                             cot=True)
    prompts = task.prompts(None)
    return prompts, [f" The answer is {it.answer}." for it in items]


def test_an_eval_run_on_the_embedded_model_never_imports_transformers(embedded_base, tmp_path):
    code = ("import sys, json; from layerswap_core.cli import main; "
            "rc = main(['eval', '--model', sys.argv[1], '--data', 'mgsm', '--lang', 'sw', "
            "'--n', '2', '--max-new-tokens', '4', '--device', 'cpu', '--out', sys.argv[2]]); "
            "print(json.dumps([rc, sorted(m for m in sys.modules "
            "if m.startswith('transformers'))]))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code, str(embedded_base), str(tmp_path / "r.json")],
                         capture_output=True, text=True, env=env, timeout=300)
    rc, imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert rc == 0 and imported == []
    assert len(json.loads((tmp_path / "r.json").read_text())["rows"]) == 2


def test_load_lean_model_declines_what_it_cannot_run(tiny, tmp_path):
    folder = tmp_path / "q"
    shutil.copytree(tiny["base"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "mlp_bias": True}))
    assert load_lean_model(str(folder)) is None
    assert load_lean_model(str(tiny["base"]), device="cpu")[0].lean
