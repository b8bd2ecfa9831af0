"""The merge engine on real tiny models, checked tensor by tensor against reference formulas."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from huggingface_hub import save_torch_state_dict

from layerswap_core.checkpoints.reading import CheckpointError, CheckpointReader
from layerswap_core.checkpoints.writing import OutputFolderError, ShardedWriter, atomic_output_dir
from layerswap_core.merge.executor import MergeError, merge_to_folder, plan_for
from layerswap_core.merge.live import LiveModel
from layerswap_core.merge.config import MergeConfig
from layerswap_core.merge.errors import ConfigError

L = 8  # layers of the tiny fixture


def layer_of(name: str):
    return int(name.split(".")[2]) if name.startswith("model.layers.") else None


def tensors(folder) -> dict[str, torch.Tensor]:
    r = CheckpointReader(folder)
    return {n: r.get(n) for n in r.names()}


@pytest.fixture(scope="module")
def states(tiny):
    return {role: tensors(p) for role, p in tiny.items()}


def blend(t, l, wt, wl):
    """The transition formula of the paper, in float32, cast back."""
    return ((wt * t.float() + wl * l.float()) / (wt + wl)).to(t.dtype)


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]


# --------------------------------------------------------------------------- Algorithm 1
def test_layer_swap_every_region(tiny, states, tmp_path):
    b, u, tb, tu, wt, wl = 2, 1, 1, 2, 0.3, 0.7
    # non_layer="task": the behaviour before non-layer averaging, bit for bit
    cfg = MergeConfig(bottom=b, top=u, transition_bottom=tb, transition_top=tu, w_task=wt,
                      w_lang=wl, non_layer="task")
    seen = []
    out = merge_to_folder(cfg, task=tiny["task"], lang=tiny["lang"], out=tmp_path / "m",
                          shard_size="200KB", progress=lambda f, m: seen.append(f))
    merged = tensors(out)
    task, lang = states["task"], states["lang"]
    assert set(merged) == set(task) and "lm_head.weight" not in merged  # tied embeddings
    regions = {"lang": 0, "blend": 0, "task": 0, "global": 0}
    for n, t in merged.items():
        layer = layer_of(n)
        assert t.dtype == task[n].dtype
        if layer is None:
            regions["global"] += 1
            assert torch.equal(t, task[n]), n
        elif layer < b or layer >= L - u:
            regions["lang"] += 1
            assert torch.equal(t, lang[n]), n
        elif layer < b + tb or layer >= L - u - tu:
            regions["blend"] += 1
            assert torch.equal(t, blend(task[n], lang[n], wt, wl)), n
            assert not torch.equal(t, task[n])
        else:
            regions["task"] += 1
            assert torch.equal(t, task[n]), n
    assert regions == {"lang": 9 * 3, "blend": 9 * 3, "task": 9 * 2, "global": 2}
    # sharded HF layout, side files, exact config
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[-1].endswith(f"-of-{len(shards):05d}.safetensors")
    assert all(Path(out / s).stat().st_size <= 200_000 + 4 * 49152 * 64 + 4096 for s in shards)
    for f in ("config.json", "generation_config.json", "tokenizer.json", "README.md", "layerswap.yaml"):
        assert (out / f).exists(), f
    saved = MergeConfig.load(out / "layerswap.yaml")
    assert (saved.bottom, saved.top, saved.w_lang) == (b, u, wl) and saved.task == str(tiny["task"])
    assert "bottom 2, top 1, transitions 1/2" in (out / "README.md").read_text()
    assert seen[-1] == 1.0 and seen == sorted(seen)
    assert leftovers(tmp_path) == []


def test_merged_folder_loads_and_generates(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = merge_to_folder(MergeConfig(), task=tiny["task"], lang=tiny["lang"], out=tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("Two plus two is", return_tensors="pt").input_ids
    gen = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert gen.shape[1] == ids.shape[1] + 5
    loaded = dict(model.named_parameters())
    for n, t in tensors(out).items():
        assert torch.equal(loaded[n].detach(), t), n


def test_output_dtype_cast(tiny, states, tmp_path):
    out = merge_to_folder(MergeConfig(bottom=1, top=1, transition_bottom=1, dtype="bfloat16"),
                          task=tiny["task"], lang=tiny["lang"], out=tmp_path / "m")
    merged = tensors(out)
    assert {t.dtype for t in merged.values()} == {torch.bfloat16}
    assert torch.equal(merged["model.layers.0.mlp.up_proj.weight"],
                       states["lang"]["model.layers.0.mlp.up_proj.weight"].bfloat16())
    n = "model.layers.1.self_attn.q_proj.weight"
    ref = ((states["task"][n].float() + states["lang"][n].float()) / 2).bfloat16()
    assert torch.equal(merged[n], ref)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_partition_preset_and_rules(tiny, states, tmp_path):
    # preset A scaled to 8 layers: all attention + MLP of the first 2 and last 1 layers -> lang
    out = merge_to_folder(MergeConfig(partition="A", scale_partition=True, non_layer="task"),
                          task=tiny["task"], lang=tiny["lang"], out=tmp_path / "a")
    for n, t in tensors(out).items():
        layer = layer_of(n)
        to_lang = layer is not None and (".self_attn." in n or (".mlp." in n and layer in (0, 1, 7)))
        assert torch.equal(t, states["lang" if to_lang else "task"][n]), n
    rules = [{"layers": "3-4", "kinds": "mlp_down,norm"}]
    out = merge_to_folder(MergeConfig(partition=rules, non_layer="task"), task=tiny["task"],
                          lang=tiny["lang"], out=tmp_path / "c")
    for n, t in tensors(out).items():
        to_lang = layer_of(n) in (3, 4) and ("down_proj" in n or "layernorm" in n)
        assert torch.equal(t, states["lang" if to_lang else "task"][n]), n


# --------------------------------------------------------------------------- weights and baselines
def reference_magnitude(states) -> tuple[float, float]:
    """Mean over every row of every 1-D/2-D parameter of mean |expert - base|; weight = 1/that."""
    out = []
    for e in ("task", "lang"):
        rows = []
        for n, t in states[e].items():
            d = (t.double() - states["base"][n].double()).abs()
            if d.dim() == 1:
                rows.append(d.mean().reshape(1))
            elif d.dim() == 2:
                rows.append(d.mean(dim=1))
        out.append(1.0 / torch.cat(rows).mean().item())
    return tuple(out)


def test_magnitude_weights_match_direct_computation(tiny, states, tmp_path):
    wt, wl = reference_magnitude(states)
    cfg = MergeConfig(bottom=1, top=1, transition_bottom=2, magnitude_weights=True)
    plan_shown = []
    out = merge_to_folder(cfg, task=tiny["task"], lang=tiny["lang"], base=tiny["base"],
                          out=tmp_path / "m", progress=lambda f, m: plan_shown.append(m))
    card = (out / "README.md").read_text()
    share = wt / (wt + wl)
    assert f"magnitude-adjusted weights: task {share:.3f}" in card
    merged = tensors(out)
    for n in merged:
        if layer_of(n) in (1, 2):
            ref = (wt * states["task"][n].float() + wl * states["lang"][n].float()) / (wt + wl)
            torch.testing.assert_close(merged[n], ref, rtol=1e-6, atol=1e-7)
        elif layer_of(n) == 0:
            assert torch.equal(merged[n], states["lang"][n])
    live = LiveModel.from_refs(tiny["task"], tiny["lang"], tiny["base"], dtype=torch.float32)
    got = live.magnitude()
    assert got == pytest.approx((wt, wl), rel=1e-6)


def test_uniform_and_magnitude_soup(tiny, states, tmp_path):
    out = merge_to_folder(MergeConfig(method="soup"), task=tiny["task"], lang=tiny["lang"],
                          out=tmp_path / "s")
    for n, t in tensors(out).items():
        assert torch.equal(t, blend(states["task"][n], states["lang"][n], 1.0, 1.0)), n
    wt, wl = reference_magnitude(states)
    out = merge_to_folder(MergeConfig(method="magnitude_soup"), task=tiny["task"], lang=tiny["lang"],
                          base=tiny["base"], out=tmp_path / "ms")
    for n, t in tensors(out).items():
        ref = (wt * states["task"][n].float() + wl * states["lang"][n].float()) / (wt + wl)
        torch.testing.assert_close(t, ref, rtol=1e-6, atol=1e-7)


def test_task_arithmetic(tiny, states, tmp_path):
    lt, ll = 0.6, 0.9
    out = merge_to_folder(MergeConfig(method="task_arithmetic", lambda_task=lt, lambda_lang=ll),
                          task=tiny["task"], lang=tiny["lang"], base=tiny["base"], out=tmp_path / "t")
    for n, t in tensors(out).items():
        b = states["base"][n]
        ref = b + lt * (states["task"][n] - b) + ll * (states["lang"][n] - b)
        torch.testing.assert_close(t, ref, rtol=0, atol=1e-6)


def reference_ties(base, experts, density, lam):
    """TIES-merging written out step by step (Yadav et al. 2023, Algorithm 1)."""
    flat_base = base.float().reshape(-1)
    trimmed = []
    for e in experts:  # deltas in float32 like the engine, so the same entries tie for top-k
        delta = e.float().reshape(-1) - flat_base
        k = max(1, int(density * delta.numel()))
        threshold = delta.abs().sort(descending=True).values[k - 1]
        trimmed.append(torch.where(delta.abs() >= threshold, delta, torch.zeros_like(delta)))
    total = sum(trimmed)
    elected = torch.where(total >= 0, 1.0, -1.0)  # a zero sum counts as positive (mergekit)
    out = torch.empty_like(flat_base)
    for i in range(flat_base.numel()):
        agreeing = [t[i] for t in trimmed if t[i] != 0 and torch.sign(t[i]) == elected[i]]
        mean = sum(agreeing) / len(agreeing) if agreeing else 0.0
        out[i] = flat_base[i] + lam * mean
    return out.reshape(base.shape)


def test_ties(tiny, states, tmp_path):
    density, lam = 0.3, 0.8
    out = merge_to_folder(MergeConfig(method="ties", ties_density=density, ties_lambda=lam),
                          task=tiny["task"], lang=tiny["lang"], base=tiny["base"], out=tmp_path / "t")
    merged = tensors(out)
    for n in ("model.layers.3.self_attn.k_proj.weight", "model.layers.0.input_layernorm.weight",
              "model.layers.7.mlp.down_proj.weight", "model.norm.weight"):
        ref = reference_ties(states["base"][n], [states["task"][n], states["lang"][n]], density, lam)
        torch.testing.assert_close(merged[n], ref, rtol=1e-6, atol=1e-6)
    assert set(merged) == set(states["task"])


# --------------------------------------------------------------------------- in-memory recomposition
def test_live_model_matches_disk_merge_and_updates_only_changes(tiny, tmp_path):
    live = LiveModel.from_refs(tiny["task"], tiny["lang"], tiny["base"], dtype=torch.float32)
    cfg = MergeConfig(bottom=2, top=1, transition_top=1, w_task=2.0, w_lang=1.0)
    params = dict(live.model.named_parameters())
    live.show("base")
    assert live.show(cfg).rewritten == len(params)
    out = merge_to_folder(cfg, task=tiny["task"], lang=tiny["lang"], out=tmp_path / "m")
    for n, t in tensors(out).items():
        assert torch.equal(params[n].detach(), t), n
    assert live.show(cfg).rewritten == 0
    nxt = MergeConfig(bottom=3, top=1, transition_top=1, w_task=2.0, w_lang=1.0)
    assert {layer_of(n) for n in live.plan_for(nxt).changed_names(live.plan)} == {2}
    live.show(nxt)
    assert live.show(MergeConfig(method="task_arithmetic")).rewritten == len(params)
    n = "model.layers.4.mlp.up_proj.weight"
    base, task, lang = (tensors(tiny[r])[n] for r in ("base", "task", "lang"))
    torch.testing.assert_close(params[n].detach(), base + (task - base) + (lang - base))
    with pytest.raises(ConfigError, match="exceeds"):
        live.show(MergeConfig(bottom=8, top=1))


def test_plan_for_reads_headers_only(tiny):
    plan = plan_for(MergeConfig(bottom=2, top=2), tiny["task"])
    assert plan.num_layers == L and "lm_head.weight" not in plan.sources
    assert [r.label for r in plan.layer_rows()] == ["lang"] * 2 + ["task"] * 4 + ["lang"] * 2


# --------------------------------------------------------------------------- bad input: clear error, nothing written
def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rewrite(folder: Path, edit):
    """Rewrite a single-file checkpoint's tensors through ``edit(dict) -> dict``."""
    from safetensors.torch import save_file
    (f,) = sorted(folder.glob("*.safetensors"))
    t = tensors(folder)
    f.unlink()
    save_file(edit(t), str(f), metadata={"format": "pt"})


def _other_model(tmp_path, name, **kw):
    from layerswap_core.testing import make_tiny_model
    return make_tiny_model(tmp_path / name, **kw)


def _bad_cases(tiny, tmp_path):
    missing = _copy(tiny["lang"], tmp_path / "missing")
    _rewrite(missing, lambda t: {k: v for k, v in t.items() if "layers.5.mlp.up_proj" not in k})
    corrupt = _copy(tiny["lang"], tmp_path / "corrupt")
    (shard,) = corrupt.glob("*.safetensors")
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    garbage = _copy(tiny["lang"], tmp_path / "garbage")
    (shard,) = garbage.glob("*.safetensors")
    shard.write_bytes(struct.pack("<Q", 12) + b"not json :-(" + b"\0" * 64)
    small_vocab = tmp_path / "vocab"
    from layerswap_core.testing import tiny_config
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_config(tiny_config(L, 64, 1000)).save_pretrained(small_vocab)
    return [
        ("architecture", dict(lang=_other_model(tmp_path, "deep", num_layers=6)), MergeError,
         "different architectures"),
        ("shapes", dict(lang=_other_model(tmp_path, "narrow", hidden=32)), MergeError, "shape"),
        ("vocab", dict(lang=small_vocab), MergeError, "different vocabulary sizes"),
        ("missing", dict(lang=missing), MergeError, "lacks 1 tensor"),
        ("corrupt", dict(lang=corrupt), CheckpointError, "corrupt"),
        ("garbage", dict(lang=garbage), CheckpointError, "safetensors"),
        ("layers", dict(config=MergeConfig(bottom=6, top=3)), ConfigError, "exceeds"),
        ("base needed", dict(config=MergeConfig(method="ties")), ConfigError, "base"),
        ("no such model", dict(lang=tmp_path / "nowhere"), ValueError, "no such folder"),
    ]


def test_bad_inputs_give_clear_errors_and_write_nothing(tiny, tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    before = {p: p.stat().st_mtime_ns for r in tiny.values() for p in Path(r).iterdir()}
    for label, kw, exc, msg in _bad_cases(tiny, inputs):
        args = dict(config=MergeConfig(), task=tiny["task"], lang=tiny["lang"],
                    out=outputs / label / "merged")
        args.update(kw)
        with pytest.raises(exc) as e:
            merge_to_folder(args.pop("config"), **args)
        assert msg in str(e.value), (label, str(e.value))
        assert list(outputs.iterdir()) == [], label
    assert {p: p.stat().st_mtime_ns for r in tiny.values() for p in Path(r).iterdir()} == before


def test_tokenizer_mismatch_needs_an_explicit_source(tiny, tmp_path):
    other = _copy(tiny["lang"], tmp_path / "other_tok")
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(MergeError, match="tokenizer"):
        merge_to_folder(MergeConfig(), task=tiny["task"], lang=other, out=tmp_path / "m")
    assert not (tmp_path / "m").exists()
    out = merge_to_folder(MergeConfig(tokenizer_source="lang"), task=tiny["task"], lang=other,
                          out=tmp_path / "m")
    assert (out / "tokenizer.json").read_text() == (other / "tokenizer.json").read_text()


def test_output_folder_rules(tiny, tmp_path):
    cfg = MergeConfig()
    kw = dict(task=tiny["task"], lang=tiny["lang"])
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(OutputFolderError, match="already exists.*overwrite"):
        merge_to_folder(cfg, out=out, **kw)
    assert (out / "keep.txt").exists()
    with pytest.raises(OutputFolderError, match="not a layerswap output.*--force"):
        merge_to_folder(cfg, out=out, overwrite=True, **kw)
    assert (out / "keep.txt").exists()
    merge_to_folder(cfg, out=out, overwrite=True, force=True, **kw)
    assert not (out / "keep.txt").exists() and (out / "config.json").exists()
    merge_to_folder(MergeConfig(bottom=1), out=out, overwrite=True, **kw)  # a layerswap output
    assert MergeConfig.load(out / "layerswap.yaml").bottom == 1
    with pytest.raises(OutputFolderError, match="inside the input model folder"):
        merge_to_folder(cfg, out=Path(tiny["lang"]) / "merged", **kw)
    assert not (Path(tiny["lang"]) / "merged").exists()
    with pytest.raises(OutputFolderError, match="inside the output folder"):
        merge_to_folder(cfg, out=Path(tiny["task"]).parent, overwrite=True, **kw)
    assert leftovers(tmp_path) == []


def test_cancelled_merge_leaves_nothing(tiny, tmp_path):
    class Cancelled(Exception):
        pass

    def cancel_midway(fraction, msg):
        if fraction > 0.5:
            raise Cancelled()

    with pytest.raises(Cancelled):
        merge_to_folder(MergeConfig(), task=tiny["task"], lang=tiny["lang"],
                        out=tmp_path / "new" / "m", progress=cancel_midway)
    assert list(tmp_path.iterdir()) == []


def test_atomic_folder_and_writer_errors(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_output_dir(tmp_path / "o") as d:
            (d / "f").write_text("partial")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    w = ShardedWriter(tmp_path, 100)
    w.declare("a", (2, 2), torch.float32)
    w.declare("b", (3,), torch.float32)
    w.declare("c", (2,), torch.float32)
    w.write("b", torch.arange(3.0))     # any order: each tensor has its place in its shard
    with pytest.raises(ValueError, match="written twice"):
        w.write("b", torch.zeros(3))
    with pytest.raises(ValueError, match="declared \\[2, 2\\]"):
        w.write("a", torch.zeros(2, 3))
    w.write("a", torch.ones(2, 2))
    with pytest.raises(ValueError, match="never written, first 'c'"):
        w.finish()
    w.close()
    src = {"x": torch.randn(5, 7), "y": torch.arange(6, dtype=torch.int64), "z": torch.randn(3).half()}
    (tmp_path / "s").mkdir()
    save_torch_state_dict(src, tmp_path / "s", max_shard_size=150)
    r = CheckpointReader(tmp_path / "s")
    assert len({r.shard(n) for n in r.names()}) == 2
    for n, t in src.items():
        assert torch.equal(r.get(n), t) and torch.equal(r.read(n), t)


# --------------------------------------------------------------------------- CLI
def test_cli_merge_config_round_trip_and_plan(tiny, tmp_path, capsys):
    from layerswap_core.cli import main

    a = tmp_path / "a"
    rc = main(["merge", "--task", str(tiny["task"]), "--lang", str(tiny["lang"]), "--bottom", "2",
               "--top", "1", "--transition-bottom", "1", "--w-task", "3", "--w-lang", "1",
               "--shard-size", "300KB", "--out", str(a)])
    assert rc == 0
    b = tmp_path / "b"
    assert main(["merge", "--config", str(a / "layerswap.yaml"), "--out", str(b)]) == 0
    ta, tb = tensors(a), tensors(b)
    assert ta.keys() == tb.keys() and all(torch.equal(ta[n], tb[n]) for n in ta)
    n = "model.layers.2.mlp.gate_proj.weight"
    assert torch.equal(ta[n], blend(tensors(tiny["task"])[n], tensors(tiny["lang"])[n], 3.0, 1.0))
    assert main(["merge", "--config", str(a / "layerswap.yaml"), "--out", str(b)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["merge", "--config", str(a / "layerswap.yaml"), "--out", str(b), "--overwrite",
                 "--partition", "C", "--scale-partition"]) == 0  # replaces bottom/top/transitions
    tc, task = tensors(b), tensors(tiny["task"])
    assert torch.equal(tc[n], task[n]) and torch.equal(tc["model.layers.1.mlp.up_proj.weight"],
                                                       tensors(tiny["lang"])["model.layers.1.mlp.up_proj.weight"])
    capsys.readouterr()
    assert main(["plan", "--task", str(tiny["task"]), "--bottom", "3", "--top", "1"]) == 0
    text = capsys.readouterr().out
    assert "0-2       lang" in text and "3-6       task" in text and "7         lang" in text
    assert main(["plan", "--task", str(tiny["task"]), "--bottom", "9"]) == 2
    assert "exceeds" in capsys.readouterr().err
