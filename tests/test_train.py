"""Training modes on the tiny 8-layer model: what trains, what stays bit-identical."""
from __future__ import annotations

import json
import math

import pytest
import torch

from layerswap_core.training import trainer as T
from layerswap_core.training.config import TrainConfig, TrainDataError, TrainError
from layerswap_core.training.sft_data import IGNORE, encode_example, read_jsonl
from layerswap_core.checkpoints.architectures import get_architecture
from layerswap_core.merge.partition import Partition

pytestmark = pytest.mark.usefixtures("one_thread")
# first 2 and last 1 of the tiny model's 8 layers -> language side (explicit rules: the presets
# A/B/C are defined for 32/36 layers)
SWAP = [{"layers": "first 2, last 1"}]


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
    return TrainConfig(**kw)


def _base_state(trainer):
    return {n: p.detach().clone() for n, p in T._base_parameters(trainer.model)}


def _changed(before, trainer) -> set[str]:
    return {n for n, p in T._base_parameters(trainer.model) if not torch.equal(before[n], p.detach())}


def test_labels_cover_exactly_the_assistant_turns(tiny):
    from layerswap_core.checkpoints.loading import load_tokenizer
    tok = load_tokenizer(tiny["base"])
    ex = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                       {"role": "user", "content": "again"}, {"role": "assistant", "content": "ok"}]}
    ids, labels = encode_example(tok, ex, 512)
    assert tok.decode(ids) == tok.apply_chat_template(ex["messages"], tokenize=False)
    learned = tok.decode([i for i, lab in zip(ids, labels) if lab != IGNORE])
    assert learned == "yo<|im_end|>\nok<|im_end|>\n"


def test_full_sft_changes_every_parameter(tiny, data, tmp_path):
    t = T.Trainer(_cfg(tiny, data, tmp_path, mode="full"))
    before = _base_state(t)
    t.train()
    assert _changed(before, t) == set(before)
    assert t.evals == []  # no eval data given
    out = t.save()
    assert (out / "config.json").exists() and (out / "training_log.json").exists()
    card = (out / "README.md").read_text()
    assert "full fine-tune of" in card and "library_name" not in card and "Reproduce" not in card


def test_lora_leaves_the_base_bit_identical_and_saves_an_adapter(tiny, data, tmp_path):
    cfg = _cfg(tiny, data, tmp_path, mode="lora", lora_rank=4,
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
    t = T.Trainer(_cfg(tiny, data, tmp_path, mode="partial", partition=SWAP, train_part=part))
    arch = get_architecture(t.model.config.to_dict())
    side = set(Partition.from_spec(SWAP, 8).parameter_names(_base_state(t), arch))
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
    t = T.Trainer(_cfg(tiny, data, tmp_path, mode="simultaneous", partition=SWAP,
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
    t = T.Trainer(_cfg(tiny, data, tmp_path, mode="simultaneous", partition=SWAP,
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
    t = T.Trainer(_cfg(tiny, data, tmp_path, mode=mode, partition=SWAP, revert="lang"))
    before = _base_state(t)
    t.train()
    if mode == "full":
        assert _changed(before, t) == set(before) - t.sides["lang"]
    else:
        merged = t.model.merge_and_unload()
        after = dict(merged.named_parameters())
        arch = get_architecture(merged.config.to_dict())
        lang = Partition.from_spec(SWAP, 8).parameter_names(before, arch)
        assert all(torch.equal(after[n], before[n]) for n in lang)
        assert any(not torch.equal(after[n], before[n]) for n in before if n not in lang)


def test_cli_trains_and_writes_the_log(tiny, data, tmp_path, capsys):
    from layerswap_core.cli import main
    out = tmp_path / "cli"
    rc = main(["train", "--model", str(tiny["base"]), "--data", str(data["task"]), "--out", str(out),
               "--steps", "1", "--batch-size", "2", "--max-length", "64", "--schedule", "cosine",
               "--warmup-steps", "1", "--grad-accum", "2", "--no-rslora"])
    assert rc == 0
    assert "learning rate 0.0002 (default for lora), cosine schedule" in capsys.readouterr().out
    log = json.loads((out / "training_log.json").read_text())
    assert log["steps"] == 1 and log["config"]["grad_accum"] == 2 and log["config"]["lr"] == 2e-4
    assert (out / "adapter_model.safetensors").exists()
    assert json.loads((out / "adapter_config.json").read_text())["use_rslora"] is False
    card = (out / "README.md").read_text()   # ours, not PEFT's boilerplate
    assert f"base_model: {tiny['base']}" in card and "More Information Needed" not in card
    assert "LoRA adapter (rank 8, alpha 16)" in card and "1 optimizer steps of 4 examples" in card
    assert "layerswap train --model" in card and "--grad-accum 2" in card


def test_cli_refuses_lora_flag_outside_simultaneous_mode(tiny, data, tmp_path, capsys):
    from layerswap_core.cli import main
    rc = main(["train", "--model", str(tiny["base"]), "--data", str(data["task"]),
               "--out", str(tmp_path / "o"), "--mode", "full", "--lora"])
    err = capsys.readouterr().err
    assert rc == 2 and "use mode lora" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


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
    with pytest.raises(TrainDataError, match=where):
        read_jsonl(f)
    with pytest.raises(TrainDataError):
        T.Trainer(TrainConfig(data=str(f), output=str(tmp_path / "o"), model=str(tiny["base"])))


def test_unknown_target_module(tiny, data, tmp_path):
    with pytest.raises(TrainError, match="unknown LoRA target module.*qkv_proj.*q_proj"):
        T.Trainer(_cfg(tiny, data, tmp_path, mode="lora", target_modules=["q_proj", "qkv_proj"]))


def test_partition_with_nothing_trainable(tiny, data, tmp_path):
    all_task = [{"to": "task"}]
    with pytest.raises(TrainError, match="no parameter on the lang side"):
        T.Trainer(_cfg(tiny, data, tmp_path, mode="partial", partition=all_task))
    with pytest.raises(TrainError, match="no projection on the lang side"):
        T.Trainer(_cfg(tiny, data, tmp_path, mode="partial_lora", partition=all_task))
    with pytest.raises(TrainError, match="needs both"):
        T.Trainer(_cfg(tiny, data, tmp_path, mode="simultaneous", partition=all_task,
                       lang_data=str(data["lang"])))
    with pytest.raises(TrainError, match="needs a partition"):
        T.Trainer(_cfg(tiny, data, tmp_path, mode="partial"))


# --------------------------------------------------------------------------- simultaneous epochs
def _numbered(path, n, word):
    return _write(path, [{"prompt": f"{word} {i}?", "response": f"{word} {i}."} for i in range(n)])


@pytest.mark.parametrize("n_task, n_lang, batch, switch, accum, epochs, steps", [
    (7, 3, 2, 1, 1, 1, 8),     # task needs 4 steps a pass, lang 2 (cycles): 4 a side
    (3, 7, 2, 1, 1, 1, 8),     # the language data is the longer one
    (7, 3, 2, 3, 1, 1, 12),    # 4 a side rounded up to whole blocks of 3: 6 a side
    (5, 2, 1, 1, 2, 1, 6),     # 5 batches of 1 in steps of 2 micro-batches: 3 a side
    (7, 3, 2, 1, 1, 2, 16),    # two epochs: every example twice
])
def test_simultaneous_epoch_is_one_pass_over_each_dataset(tiny, tmp_path, n_task, n_lang, batch,
                                                          switch, accum, epochs, steps):
    task = _numbered(tmp_path / "t.jsonl", n_task, "task")
    lang = _numbered(tmp_path / "l.jsonl", n_lang, "lang")
    t = T.Trainer(TrainConfig(data=str(task), lang_data=str(lang), output=str(tmp_path / "o"),
                                model=str(tiny["base"]), mode="simultaneous", partition=SWAP,
                                batch_size=batch, switch_every=switch, grad_accum=accum,
                                epochs=epochs, max_length=64))
    seen = {"data": [], "lang_data": []}
    sides = []
    t.batch_hooks.append(lambda step, dataset, idx: (seen[dataset].extend(idx),
                                                     sides.append((step, dataset))))
    t.train()
    assert t.total_steps == len(t.history) == steps
    for dataset, n in (("data", n_task), ("lang_data", n_lang)):
        counts = [seen[dataset].count(i) for i in range(n)]
        assert min(counts) >= epochs, (dataset, counts)
        # each side trained half the steps, grad_accum batches each
        assert len(seen[dataset]) == steps // 2 * accum * batch
    # the batches of a step come from the dataset of that step's side
    assert all(dataset == ("lang_data" if t.side_at(step) == "lang" else "data")
               for step, dataset in sides)


def test_plain_epochs_count_batches_of_the_one_dataset(tiny, tmp_path):
    cfg = TrainConfig(data="x", output="o", batch_size=2, grad_accum=2, epochs=1.5).validate()
    assert T.total_steps(cfg, 7) == 3          # ceil(ceil(7/2)/2) = 2 a pass, 1.5 passes
    assert T.total_steps(TrainConfig(data="x", output="o", steps=5), 7) == 5


# --------------------------------------------------------------------------- simultaneous LoRA
def _lora_state(t):
    return {n: p.detach().clone() for n, p in t.model.named_parameters() if "lora_" in n}


def test_simultaneous_lora_trains_each_sides_adapters_only_on_its_steps(tiny, tiny_lm, data,
                                                                      tmp_path):
    cfg = _cfg(tiny, data, tmp_path, mode="simultaneous", lora=True, partition=SWAP,
               lang_data=str(data["lang"]), steps=4, lr=1e-2)
    t = T.Trainer(cfg)
    arch = get_architecture(t.model.config.to_dict())
    adapted = {T._base_name(n.split(".lora_")[0]) + ".weight" for n in _lora_state(t)}
    # every attention and MLP projection of both sides
    assert adapted == {m + ".weight" for m in T.linear_modules(tiny_lm[0], arch)}
    assert len(adapted) == 8 * 7
    lang_w = set(Partition.from_spec(SWAP, 8).parameter_names(_base_state(t), arch))
    assert {T._lora_weight_name(n) for n in t.sides["lang"]} == adapted & lang_w
    assert {T._lora_weight_name(n) for n in t.sides["task"]} == adapted - lang_w
    base_before = _base_state(t)
    moved = {"lang": set(), "task": set()}
    for s in range(4):
        before = _lora_state(t)
        t.step(s)
        changed = {n for n, p in _lora_state(t).items() if not torch.equal(p, before[n])}
        side = t.history[-1]["part"]
        assert changed and changed <= t.sides[side], (s, side)   # only this step's side moved
        moved[side] |= changed
    assert [r["part"] for r in t.history] == ["lang", "task", "lang", "task"]
    assert moved == t.sides     # every adapter of each side learned on its own steps
    assert _changed(base_before, t) == set()


def test_simultaneous_lora_saves_a_loadable_rslora_adapter(tiny, data, tmp_path):
    from layerswap_core.checkpoints.adapters import load_adapter
    t = T.Trainer(_cfg(tiny, data, tmp_path, mode="simultaneous", lora=True, partition=SWAP,
                       lang_data=str(data["lang"]), steps=4))
    t.train()
    out = t.save()
    adapter = load_adapter(out, tiny["base"])
    live = dict(t.model.named_parameters())
    for mod, m in adapter.modules.items():
        assert torch.equal(m.A, live[f"base_model.model.{mod}.lora_A.default.weight"])
        assert torch.equal(m.B, live[f"base_model.model.{mod}.lora_B.default.weight"])
    assert {f"base_model.model.{mod}.lora_{ab}.default.weight" for mod in adapter.modules
            for ab in "AB"} == set(_lora_state(t))
    acfg = json.loads((out / "adapter_config.json").read_text())
    assert acfg["use_rslora"] is True                     # rsLoRA is the default
    assert next(iter(adapter.modules.values())).scale == pytest.approx(16 / 8 ** 0.5)
    log = json.loads((out / "training_log.json").read_text())
    assert log["config"]["lr"] == 1e-2 and log["config"]["lora"] is True


# --------------------------------------------------------------------------- defaults
@pytest.mark.parametrize("mode, lora, lr", [
    ("full", False, 1e-5), ("partial", False, 1e-5), ("simultaneous", False, 1e-5),
    ("lora", False, 2e-4), ("partial_lora", False, 2e-4), ("simultaneous", True, 2e-4)])
def test_default_learning_rate_per_mode(mode, lora, lr):
    cfg = TrainConfig(data="x", output="o", mode=mode, lora=lora, partition="B",
                        lang_data="l").validate()
    assert cfg.lr == lr and cfg.rslora is True and cfg.schedule == "linear"
    given = TrainConfig(data="x", output="o", mode=mode, lora=lora, partition="B",
                          lang_data="l", lr=3e-3).validate()
    assert given.lr == 3e-3


@pytest.mark.parametrize("bad, match", [
    ({"mode": "full", "lora": True}, "use mode lora"),
    ({"mode": "partial", "lora": True, "partition": "B"}, "use mode partial_lora"),
    ({"lr": 0.0}, "lr: must be positive"),
    ({"schedule": "step"}, "choose one of constant, linear, cosine, wsd"),
    ({"decay_fraction": 0.0}, "decay_fraction"),
    ({"save_every": -1}, "save_every"),
])
def test_bad_training_options(bad, match):
    with pytest.raises(TrainError, match=match):
        TrainConfig(data="x", output="o", **bad).validate()


@pytest.mark.parametrize("schedule, expected", [
    ("constant", [0, .5] + [1] * 8),
    ("linear", [0, .5] + [(10 - s) / 8 for s in range(2, 10)]),
    ("cosine", [0, .5] + [0.5 * (1 + math.cos(math.pi * (s - 2) / 8)) for s in range(2, 10)]),
    ("wsd", [0, .5] + [1] * 5 + [1, .75, .25]),  # 10 steps: 2 warmup, 5 stable, 3 decay (30%)
])
def test_schedules_are_transformers_schedules(tiny, data, tmp_path, schedule, expected):
    import transformers
    cfg = _cfg(tiny, data, tmp_path, mode="lora", steps=10, warmup_steps=2, schedule=schedule,
               decay_fraction=0.3, lr=1e-3)
    t = T.Trainer(cfg)
    for s in range(10):
        t.step(s)
    used = [r["lr"] for r in t.history]
    assert used == pytest.approx([1e-3 * f for f in expected], abs=1e-12)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    make = {"constant": lambda: transformers.get_constant_schedule_with_warmup(opt, 2),
            "linear": lambda: transformers.get_linear_schedule_with_warmup(opt, 2, 10),
            "cosine": lambda: transformers.get_cosine_schedule_with_warmup(opt, 2, 10),
            "wsd": lambda: transformers.get_wsd_schedule(opt, 2, 3, num_training_steps=10)}
    ref = make[schedule]()
    ref_lrs = []
    for _ in range(10):
        ref_lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        ref.step()
    assert used == ref_lrs


# --------------------------------------------------------------------------- checkpoints
def test_save_every_writes_loadable_checkpoints_without_disturbing_training(tiny, data, tmp_path):
    from safetensors import safe_open

    from layerswap_core.checkpoints.loading import load_model
    cfg = _cfg(tiny, data, tmp_path, mode="full", steps=5, save_every=2, revert="lang",
               partition=SWAP, save_dtype="bfloat16", lr=1e-3)
    t = T.Trainer(cfg)
    base = _base_state(t)
    t.train()
    out = t.save()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert t.checkpoints == [out / "checkpoint-2", out / "checkpoint-4"]
    assert all(p.dtype == torch.float32 for p in t.model.parameters())  # not cast by saving
    # the same run without checkpoints, stepped by hand: checkpoint-2 is its state after 2 steps
    # (lang side reverted, as the final model is) and the final models are identical
    ref = T.Trainer(TrainConfig(**{**cfg.__dict__, "save_every": 0,
                                     "output": str(tmp_path / "ref")}))
    for s in range(2):
        ref.step(s)
    ckpt, _ = load_model(out / "checkpoint-2")
    assert json.loads((out / "checkpoint-2" / "config.json").read_text())["dtype"] == "bfloat16"
    got = dict(ckpt.named_parameters())
    for n, p in T._base_parameters(ref.model):
        want = (base[n] if n in t.sides["lang"] else p.detach()).to(torch.bfloat16).float()
        assert torch.equal(got[n], want), n
    assert not torch.equal(got["model.layers.3.mlp.up_proj.weight"],
                           base["model.layers.3.mlp.up_proj.weight"].bfloat16().float())
    for s in range(2, 5):
        ref.step(s)
    ref.revert()
    final = dict(T._base_parameters(t.model))
    assert all(torch.equal(p, final[n]) for n, p in T._base_parameters(ref.model))
    log = json.loads((out / "checkpoint-4" / "training_log.json").read_text())
    assert log["steps"] == 4 and [r["step"] for r in log["train_losses"]] == [1, 2, 3, 4]
    with safe_open(str(out / "checkpoint-2" / "model.safetensors"), "pt") as f, \
            safe_open(str(tiny["base"] / "model.safetensors"), "pt") as g:
        assert set(f.keys()) == set(g.keys())             # tied embeddings written once


def test_save_every_with_lora_writes_adapters(tiny, data, tmp_path):
    from layerswap_core.checkpoints.adapters import load_adapter
    res = T.train(_cfg(tiny, data, tmp_path, mode="lora", steps=3, save_every=1))
    folders = sorted(res.output.glob("checkpoint-*"))
    assert [p.name for p in folders] == ["checkpoint-1", "checkpoint-2"]
    b = [next(m.B for m in load_adapter(p, tiny["base"]).modules.values()) for p in folders]
    b.append(next(m.B for m in load_adapter(res.output, tiny["base"]).modules.values()))
    assert not torch.equal(b[0], b[1]) and not torch.equal(b[1], b[2])


def test_presets_train_the_published_layers_or_scale_only_when_asked(tiny_lm):
    """Preset B is 8 + 4 absolute layers: refused on the 8-layer tiny model unless scaled (the
    tool's own rule), which then gives layers 0-1 and 7 to the language side."""
    model, _ = tiny_lm
    arch = get_architecture(model.config.to_dict())
    with pytest.raises(ValueError, match="B"):
        T.partition_sides(model, "B", arch)
    sides = T.partition_sides(model, "B", arch, scale=True)
    lang_layers = {int(n.split(".")[2]) for n in sides["lang"] if ".layers." in n}
    assert lang_layers == {0, 1, 7}
    assert sides["lang"].isdisjoint(sides["task"])


class _Stop(Exception):
    pass


@pytest.mark.parametrize("kw", [
    # LoRA with dropout (the torch random state matters) and batches that cross passes
    {"mode": "partial_lora", "partition": SWAP, "lora_rank": 4, "lora_dropout": 0.1,
     "batch_size": 4},
    # two datasets, one optimizer switching sides: both data orders and the side schedule
    {"mode": "simultaneous", "partition": SWAP, "lang_data": "lang", "lr": 1e-3},
], ids=["partial_lora", "simultaneous"])
def test_a_resumed_run_equals_the_uninterrupted_run_bit_for_bit(tiny, data, tmp_path, kw):
    """Stopped by an error in step 4 (after checkpoint-2), resumed: the same losses, validation
    losses and final weights, bit for bit, as the run that never stopped."""
    if kw.get("lang_data"):
        kw = {**kw, "lang_data": str(data["lang"])}
    common = dict(steps=6, save_every=2, eval_every=2, eval_data=str(data["task"]),
                  save_dtype="bfloat16", schedule="linear", warmup_steps=1, **kw)
    whole = T.Trainer(_cfg(tiny, data, tmp_path / "whole", **common))
    whole.train()

    cut = T.Trainer(_cfg(tiny, data, tmp_path / "cut", **common))

    def stop(step, _dataset, _indices):
        if step == 3:
            raise _Stop
    cut.batch_hooks.append(stop)
    with pytest.raises(_Stop):
        cut.train()
    out = tmp_path / "cut" / "out"
    assert T.find_resume_state(out) == out / "checkpoint-2" / T.STATE_FILE
    assert list(out.glob(f"*/{T.STATE_FILE}")) == [out / "checkpoint-2" / T.STATE_FILE]
    at_2 = torch.load(out / "checkpoint-2" / T.STATE_FILE, weights_only=False)["params"]
    resumed = T.Trainer(_cfg(tiny, data, tmp_path / "cut", **common), resume=True)
    assert resumed.start_step == 2
    resumed.train()

    assert resumed.history == whole.history and len(whole.history) == 6
    # one state kept, the last checkpoint's; every checkpoint keeps its model or adapter
    assert list(out.glob(f"*/{T.STATE_FILE}")) == [out / "checkpoint-4" / T.STATE_FILE]
    assert {p.parent.name for p in out.glob("checkpoint-*/*.safetensors")} == \
        {"checkpoint-2", "checkpoint-4"}
    assert resumed.evals == whole.evals and [e["step"] for e in whole.evals] == [0, 2, 4, 6]
    got, want = resumed._trainable(), whole._trainable()
    assert set(got) == set(want) and got
    assert all(torch.equal(got[n], want[n]) for n in want)
    # without the state's random states and data order it would differ: a fresh run from the
    # checkpoint's weights alone is not the same run
    fresh = T.Trainer(_cfg(tiny, data, tmp_path / "fresh", **common))
    with torch.no_grad():
        for n, p in fresh._trainable().items():
            p.copy_(at_2[n])
    fresh.step(2)
    assert fresh.history[-1]["loss"] != whole.history[2]["loss"]


def test_resume_refuses_a_state_of_other_options(tiny, data, tmp_path):
    cfg = _cfg(tiny, data, tmp_path, mode="lora", lora_rank=4, steps=2, save_every=1)
    T.train(cfg)
    with pytest.raises(TrainError, match=r"other options \(lr\)"):
        T.Trainer(TrainConfig(**{**cfg.__dict__, "lr": 5e-3}), resume=True)
    # a changed thread count is allowed (it changes where the run runs, not what it computes)
    again = T.Trainer(TrainConfig(**{**cfg.__dict__, "threads": 1}), resume=True)
    assert again.start_step == 1
    # the same path with other bytes is other data
    changed = _write(tmp_path / "changed.jsonl", read_jsonl(data["task"])[:4])
    state = T.find_resume_state(cfg.output)
    moved = TrainConfig(**{**cfg.__dict__, "data": str(changed)})
    saved = torch.load(state, weights_only=False)
    saved["config"]["data"] = str(changed)
    torch.save(saved, state)
    with pytest.raises(TrainError, match="other data"):
        T.Trainer(moved, resume=True)


@pytest.mark.parametrize("expert", ["smollm2-math-en", "smollm2-swahili", "gemma3-bengali"])
def test_train_command_gives_the_logged_configuration_back(expert, tmp_path):
    """A shipped expert's logged configuration as a `layerswap train` line (``train_command``,
    the cross-fitting's runs), parsed by the CLI: the same configuration on other files."""
    import argparse

    from layerswap_core.checkpoints.embedded import ASSETS
    from layerswap_core.cli import train as cli_train
    from layerswap_core.training.config import train_command
    from dataclasses import asdict

    logged = json.loads((ASSETS / expert / "training_log.json").read_text())["config"]
    paths = {"data": str(tmp_path / "t.jsonl"), "eval_data": str(tmp_path / "e.jsonl"),
             "output": str(tmp_path / "out")}
    argv = train_command(logged, **paths)
    assert argv[:2] == ["layerswap", "train"]
    parser = argparse.ArgumentParser()
    cli_train.add_cli(parser.add_subparsers())
    cfg = cli_train.config_from_args(parser.parse_args(argv[1:])).validate()
    assert asdict(cfg) == {**logged, **paths}
