"""Every bench script starts and explains itself (``--help``): the benches are not run in CI
(they measure speed and memory on purpose-built checkpoints), but a renamed function or a
broken import in one of them shows up here, not months later."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py"))


def test_there_are_bench_scripts():
    assert "merge_bench.py" in SCRIPTS and len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_help(script):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--help"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout


def test_the_merge_bench_forks_its_contenders_from_a_small_process():
    """A forked contender's peak RSS starts at its parent's: the merge bench's own process must
    not import torch (a run that did reported 287 MiB for `cp -r`), and it still finds mergekit
    the way the tests do."""
    code = ("import sys; sys.argv = ['merge_bench']; sys.path.insert(0, 'bench'); "
            "import merge_bench; from layerswap_core import testing; "
            "print(merge_bench.mergekit_yaml() == testing.mergekit_yaml())")
    probe = ("import sys; sys.argv = ['merge_bench']; sys.path.insert(0, 'bench'); "
             "import merge_bench; print('torch' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [subprocess.run([sys.executable, "-c", c], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300) for c in (probe, code)]
    assert [r.stdout.strip() for r in run] == ["False", "True"], [r.stderr[-500:] for r in run]


def test_synthetic_checkpoints_carry_a_tokenizer_of_their_vocabulary(tmp_path, monkeypatch):
    """bench/synthetic.py's tokenizer: the config's vocabulary exactly, Llama-3's special tokens
    at its end (their ids in the config and generation_config.json), a chat template that
    renders; loaded by transformers as a user's would be."""
    from transformers import AutoTokenizer

    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import synthetic

    cfg = synthetic.llama_config_for(0, vocab=4096)
    cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=4)
    out = synthetic.write_checkpoint(tmp_path / "m", cfg)
    tok = AutoTokenizer.from_pretrained(out)
    written = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    assert len(tok) == 4096 == written["vocab_size"]
    assert tok.bos_token_id == written["bos_token_id"] == 4096 - 256
    assert tok.convert_ids_to_tokens(written["eos_token_id"]) == "<|eot_id|>"
    assert written["eos_token_id"] in generation["eos_token_id"]
    ids = tok("Hello world")["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.decode(ids[1:]) == "Hello world"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_synthetic_shapes_are_the_published_models(tmp_path, monkeypatch):
    """``--shape``: the tensors of bench/synthetic.py's published shapes add up to the models'
    published parameter counts (Llama-3.2-1B 1,235,814,400 with its head tied to the embeddings;
    TinyLlama-1.1B 1,100,048,384), and a scaled-down copy of the Llama-3.2-1B shape (grouped
    query heads, tied head) loads in transformers with no missing or unexpected weight."""
    import math

    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import synthetic

    counts = {name: sum(math.prod(s) for _, s in synthetic.tensor_shapes(synthetic.shape_config(name)))
              for name in synthetic.SHAPES}
    assert counts == {"llama-3.2-1b": 1_235_814_400, "tinyllama-1.1b": 1_100_048_384}
    cfg = synthetic.shape_config("llama-3.2-1b")
    cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, vocab_size=1024)
    out = synthetic.write_checkpoint(tmp_path / "m", cfg)
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (2 * 16, 64)
