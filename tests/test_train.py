"""Training modes on the tiny 8-layer model: what trains, what stays bit-identical."""
from __future__ import annotations

import json

import pytest
import torch

from layerswap_core import train as T
from layerswap_core.architectures import get_architecture
from layerswap_core.plan import Partition


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    task = _write(d / "task.jsonl", [
        {"prompt": f"What is {a} + {b}?", "response": f"{a} + {b} = {a + b}. #### {a + b}"}
        for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12)]])
    lang = _write(d / "lang.jsonl", [
        {"messages": [{"role": "user", "content": f"Tafsiri: {w}"},
                      {"role": "assistant", "content": t}]}
        for w, t in [("water", "maji"), ("house", "nyumba"), ("child", "mtoto"),
                     ("tree", "mti"), ("book", "kitabu"), ("food", "chakula")]])
    return {"task": task, "lang": lang}


def _cfg(tiny, data, tmp_path, **kw):
    kw = {"data": str(data["task"]), "output": str(tmp_path / "out"), "model": str(tiny["base"]),
          "steps": 2, "batch_size": 2, "lr": 1e-2, "max_length": 64, "save_dtype": None, **kw}
    return T.TrainConfig(**kw)


def _base_state(trainer):
    return {n: p.detach().clone() for n, p in T._base_parameters(trainer.model)}


def _changed(before, trainer) -> set[str]:
    return {n for n, p in T._base_parameters(trainer.model) if not torch.equal(before[n], p.detach())}


def test_labels_cover_exactly_the_assistant_turns(tiny):
    from layerswap_core.models import load_tokenizer
    tok = load_tokenizer(tiny["base"])
    ex = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                       {"role": "user", "content": "again"}, {"role": "assistant", "content": "ok"}]}
    ids, labels = T.encode(tok, ex, 512)
    assert tok.decode(ids) == tok.apply_chat_template(ex["messages"], tokenize=False)
    learned = tok.decode([i for i, lab in zip(ids, labels) if lab != T.IGNORE])
    assert learned == "yo<|im_end|>\nok<|im_end|>\n"


def test_full_sft_changes_every_parameter(tiny, data, tmp_path):
    t = T.Trainer(_cfg(tiny, data, tmp_path, mode="full"))
    before = _base_state(t)
    t.train()
    assert _changed(before, t) == set(before)
    assert t.evals == []  # no eval data given
    out = t.save()
    assert (out / "config.json").exists() and (out / "training_log.json").exists()


def test_lora_leaves_the_base_bit_identical_and_saves_an_adapter(tiny, data, tmp_path):
    cfg = _cfg(tiny, data, tmp_path, mode="lora", lora_rank=4, rslora=True,
               eval_data=str(data["task"]), save_dtype="bfloat16")
    res = T.train(cfg)
    assert res.eval_after < res.eval_before  # it learned the training set
    from safetensors.torch import load_file
    sd = load_file(str(res.output / "adapter_model.safetensors"))
    arch_kinds = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert {k.split(".lora_")[0].rsplit(".", 1)[-1] for k in sd} == arch_kinds
    assert all(v.dtype == torch.bfloat16 for v in sd.values())
    acfg = json.loads((res.output / "adapter_config.json").read_text())
    assert acfg["use_rslora"] and acfg["r"] == 4 and acfg["base_model_name_or_path"] == str(tiny["base"])
    t = T.Trainer(cfg)
    before = _base_state(t)
    t.step(0)
    assert _changed(before, t) == set()
    lora_b = [p for n, p in t.model.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.abs().sum() > 0 for p in lora_b)


@pytest.mark.parametrize("part", ["lang", "task"])
def test_partial_sft_trains_only_its_side(tiny, data, tmp_path, part):
    t = T.Trainer(_cfg(tiny, data, tmp_path, mode="partial", partition="B", train_part=part))
    arch = get_architecture(t.model.config.to_dict())
    side = set(Partition.preset("B", 8).parameter_names(_base_state(t), arch))
    expected = side if part == "lang" else set(_base_state(t)) - side
    before = _base_state(t)
    t.train()
    assert _changed(before, t) == expected


def test_partial_lora_adapts_only_projections_on_its_side(tiny, data, tmp_path):
    rules = [{"layers": "0-1", "kinds": "attention"}]
    t = T.Trainer(_cfg(tiny, data, tmp_path, mode="partial_lora", partition=rules))
    adapted = {n.split(".lora_")[0] for n, _ in t.model.named_parameters() if "lora_A" in n}
    assert {T._base_name(n) for n in adapted} == {
        f"model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    before = _base_state(t)
    t.train()
    assert _changed(before, t) == set()


def test_simultaneous_alternates_sides_and_datasets(tiny, data, tmp_path):
    t = T.Trainer(_cfg(tiny, data, tmp_path, mode="simultaneous", partition="C",
                       lang_data=str(data["lang"]), switch_every=2, steps=6))
    sides = t.sides
    before = _base_state(t)
    t.step(0)
    lang_changed = _changed(before, t)
    assert lang_changed == sides["lang"]
    assert (t.lang_data.served, t.data.served) == (1, 0)
    state_after_lang = {id(p): {k: v.clone() for k, v in t.optimizer.state[p].items()}
                        for p in t.optimizer.state}
    assert {n for n, p in T._base_parameters(t.model) if p in t.optimizer.state} == sides["lang"]
    t.step(1)
    mid = _base_state(t)
    for s in range(2, 4):
        t.step(s)
    # task steps: lang parameters and their optimizer states untouched
    assert {n for n in mid if not torch.equal(mid[n], _base_state(t)[n])} == sides["task"]
    for n, p in T._base_parameters(t.model):
        if n in sides["lang"]:
            assert t.optimizer.state[p]["step"] == 2
            for k, v in t.optimizer.state[p].items():
                if k != "step":
                    assert not torch.equal(v, state_after_lang[id(p)][k])  # 2nd lang step moved it
        else:
            assert t.optimizer.state[p]["step"] == 2
    t.step(4)
    assert [r["part"] for r in t.history] == ["lang", "lang", "task", "task", "lang"]
    assert (t.lang_data.served, t.data.served) == (3, 2)


def test_simultaneous_frozen_optimizer_state_is_untouched(tiny, data, tmp_path):
    t = T.Trainer(_cfg(tiny, data, tmp_path, mode="simultaneous", partition="C",
                       lang_data=str(data["lang"]), weight_decay=0.1))
    t.step(0)
    snap = {n: {k: v.clone() for k, v in t.optimizer.state[p].items()}
            for n, p in T._base_parameters(t.model) if p in t.optimizer.state}
    params_lang = {n: p.detach().clone() for n, p in T._base_parameters(t.model) if n in t.sides["lang"]}
    t.step(1)  # task side
    for n, p in T._base_parameters(t.model):
        if n in t.sides["lang"]:
            assert torch.equal(p.detach(), params_lang[n])  # weight decay not applied either
            for k, v in t.optimizer.state[p].items():
                assert torch.equal(v, snap[n][k])


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_train_then_revert_restores_the_side_exactly(tiny, data, tmp_path, mode):
    t = T.Trainer(_cfg(tiny, data, tmp_path, mode=mode, partition="B", revert="lang"))
    before = _base_state(t)
    t.train()
    if mode == "full":
        assert _changed(before, t) == set(before) - t.sides["lang"]
    else:
        merged = t.model.merge_and_unload()
        after = dict(merged.named_parameters())
        lang = Partition.preset("B", 8).parameter_names(before, get_architecture(merged.config.to_dict()))
        assert all(torch.equal(after[n], before[n]) for n in lang)
        assert any(not torch.equal(after[n], before[n]) for n in before if n not in lang)


def test_cli_trains_and_writes_the_log(tiny, data, tmp_path):
    from layerswap_core.cli import main
    out = tmp_path / "cli"
    rc = main(["train", "--model", str(tiny["base"]), "--data", str(data["task"]), "--out", str(out),
               "--steps", "1", "--batch-size", "2", "--max-length", "64", "--schedule", "cosine",
               "--warmup-steps", "1", "--grad-accum", "2"])
    assert rc == 0
    log = json.loads((out / "training_log.json").read_text())
    assert log["steps"] == 1 and log["config"]["grad_accum"] == 2
    assert (out / "adapter_model.safetensors").exists()


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("text, where", [
    ("", "no examples"),
    ('{"prompt": "a", "response": "b"}\n\n{"prompt": "a", "response": "b"\n', ":3: not valid JSON"),
    ('{"prompt": "a", "response": "b"}\n{"text": "x"}\n', ":2: expected 'messages' or 'prompt'"),
    ('{"messages": [{"role": "user", "content": "x"}]}\n', ":1: no assistant message"),
    ('[1, 2]\n', ":1: expected a JSON object"),
])
def test_bad_data_files_name_the_line(tiny, tmp_path, text, where):
    f = tmp_path / "bad.jsonl"
    f.write_text(text)
    with pytest.raises(T.DataError, match=where):
        T.read_jsonl(f)
    with pytest.raises(T.DataError):
        T.Trainer(T.TrainConfig(data=str(f), output=str(tmp_path / "o"), model=str(tiny["base"])))


def test_unknown_target_module(tiny, data, tmp_path):
    with pytest.raises(T.TrainError, match="unknown LoRA target module.*qkv_proj.*q_proj"):
        T.Trainer(_cfg(tiny, data, tmp_path, mode="lora", target_modules=["q_proj", "qkv_proj"]))


def test_partition_with_nothing_trainable(tiny, data, tmp_path):
    all_task = [{"to": "task"}]
    with pytest.raises(T.TrainError, match="no parameter on the lang side"):
        T.Trainer(_cfg(tiny, data, tmp_path, mode="partial", partition=all_task))
    with pytest.raises(T.TrainError, match="no projection on the lang side"):
        T.Trainer(_cfg(tiny, data, tmp_path, mode="partial_lora", partition=all_task))
    with pytest.raises(T.TrainError, match="needs both"):
        T.Trainer(_cfg(tiny, data, tmp_path, mode="simultaneous", partition=all_task,
                       lang_data=str(data["lang"])))
    with pytest.raises(T.TrainError, match="needs a partition"):
        T.Trainer(_cfg(tiny, data, tmp_path, mode="partial"))
