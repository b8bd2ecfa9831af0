"""Delta statistics, cache, LoRA deltas and the suggested configuration, on tiny real models."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from layerswap_core.analysis import deltas as analysis
from layerswap_core.analysis.deltas import DeltaMismatchError, delta_stats
from layerswap_core.analysis.providers import lora_delta_provider
from layerswap_core.analysis.suggest import suggest_config
from layerswap_core.checkpoints.architectures import get_architecture
from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.testing import make_expert, make_tiny_model

MATRIX_KINDS = ("attn_q", "attn_k", "attn_v", "attn_o", "mlp_gate", "mlp_up", "mlp_down")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test gets an empty delta cache. (Models built inside tests take their tokenizer from
    the ``embedded_base`` folder: resolving the embedded reference here would rebuild it.)"""
    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "cache"))


def direct_row_mavs(base: Path, expert: Path) -> dict[str, np.ndarray]:
    """Reference: whole-tensor float32 torch computation, straight from the files."""
    b, e = load_file(str(base / "model.safetensors")), load_file(str(expert / "model.safetensors"))
    out = {}
    for n, t in b.items():
        if t.dim() in (1, 2):
            d = (e[n].float() - t.float()).abs()
            out[n] = (d.mean(-1, keepdim=True) if t.dim() == 1 else d.mean(-1)).reshape(-1).numpy()
    return out


def _mappings_of(folder: Path) -> int:
    maps = Path("/proc/self/maps")
    return maps.read_text().count(str(folder)) if maps.exists() else 0


def test_stats_equal_direct_computation(tiny):
    before = _mappings_of(tiny["task"])  # other tests in this process may hold their own maps
    st = delta_stats(tiny["base"], tiny["task"], cache=False)
    assert _mappings_of(tiny["task"]) <= before  # every mmap'd tensor was released again
    ref = direct_row_mavs(tiny["base"], tiny["task"])
    assert {s.name for s in st.tensors} == set(ref)
    arch = get_architecture(CheckpointReader(tiny["base"]).config())
    for s in st.tensors:
        r = ref[s.name]
        assert s.rows == len(r)
        np.testing.assert_allclose(s.row_mavs, np.sort(r), rtol=1e-5, atol=1e-9, err_msg=s.name)
        assert s.mean_row_mav == pytest.approx(float(r.mean()), rel=1e-5)
        assert s.max_row_mav == pytest.approx(float(r.max()), rel=1e-6)
        assert (s.layer, s.kind) == tuple(arch.classify(s.name))
        for tau in (0.0, float(np.median(r)), float(r.max())):
            assert s.frac_rows_above(tau) == pytest.approx(float((r > tau).mean()))
    rows = st.table(0.004)
    assert {r["name"] for r in rows} == set(ref)
    assert set(rows[0]) == {"name", "layer", "kind", "shape", "mean_row_mav", "max_row_mav",
                            "frac_rows_above"}


def test_planted_changes_light_up_exactly_the_planted_cells(tiny, tmp_path):
    planted = {(3, "attn_q"), (3, "mlp_down"), (6, "attn_q"), (6, "mlp_down")}
    exp = make_expert(tiny["base"], tmp_path / "exp", seed=5, layer_scale={3: 0.5, 6: 0.2},
                      kinds={"attn_q", "mlp_down"})
    st = delta_stats(tiny["base"], exp)
    layers, kinds, frac = st.grid("frac_rows_above", tau=1e-7)
    lit = {(layers[i], kinds[j]) for i, j in zip(*np.nonzero(frac > 0))}
    assert lit == planted
    assert all(frac[l, kinds.index(k)] == 1.0 for l, k in planted)
    _, _, mav = st.grid("mean_row_mav")
    assert mav[3, kinds.index("attn_q")] > 2 * mav[6, kinds.index("attn_q")] > 0  # scale 0.5 vs 0.2
    prof = st.layer_profile()
    assert np.nonzero(prof)[0].tolist() == [3, 6]


def test_tiny_family_at_the_automatic_threshold(tiny):
    """task: layers 2..5 strong, lang: 0, 1, 7 strong; all others slightly changed."""
    for role, strong in (("task", {2, 3, 4, 5}), ("lang", {0, 1, 7})):
        st = delta_stats(tiny["base"], tiny[role])
        layers, kinds, frac = st.grid(kinds=MATRIX_KINDS)
        lit = {layers[i] for i, j in zip(*np.nonzero(frac > 0.5))}
        assert lit == strong, role
        assert np.all(frac[sorted(strong)] > 0.99) and np.all(np.delete(frac, sorted(strong), 0) < 0.01)


def test_threshold_changes_read_no_tensors(tiny, monkeypatch):
    """Spies (that call through) on every way a tensor can be loaded: the reader's read/get and
    the analysis' mmap loader."""
    calls = []
    for meth in ("read", "get"):
        orig = getattr(CheckpointReader, meth)

        def spy(self, name, *a, _orig=orig, **kw):
            calls.append(name)
            return _orig(self, name, *a, **kw)
        monkeypatch.setattr(CheckpointReader, meth, spy)
    orig_open = analysis.open_tensor

    def spy_open(reader, name, *a, **kw):
        calls.append(name)
        return orig_open(reader, name, *a, **kw)
    monkeypatch.setattr(analysis, "open_tensor", spy_open)
    st = delta_stats(tiny["base"], tiny["lang"])
    assert len(calls) == 2 * len(st.tensors)  # every tensor pair read exactly once
    calls.clear()
    ref = direct_row_mavs(tiny["base"], tiny["lang"])
    name = "model.layers.0.self_attn.q_proj.weight"
    fracs = []
    for tau in np.geomspace(1e-4, 1e-1, 7):
        row = next(r for r in st.table(tau) if r["name"] == name)
        assert row["frac_rows_above"] == pytest.approx(float((ref[name] > tau).mean()))
        fracs.append(st.grid("frac_rows_above", tau)[2])
    assert calls == []
    assert not np.allclose(fracs[0], fracs[-1])  # the threshold did change the picture


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_cache_hit_is_fast_and_invalidated_when_a_file_changes(tiny, tmp_path):
    expert = Path(shutil.copytree(tiny["task"], tmp_path / "task"))
    first = delta_stats(tiny["base"], expert)
    assert not first.from_cache
    assert list((Path(os.environ["LAYERSWAP_CACHE"]) / "deltas").glob("*.npz"))
    t0 = time.perf_counter()
    hit = delta_stats(tiny["base"], expert, threshold=0.01)
    assert time.perf_counter() - t0 < 0.1
    assert hit.from_cache and hit.threshold == 0.01
    assert [s.name for s in hit.tensors] == [s.name for s in first.tensors]
    for a, b in zip(hit.tensors, first.tensors):
        np.testing.assert_array_equal(a.row_mavs, b.row_mavs)
        assert (a.mean_row_mav, a.max_row_mav, a.shape, a.layer, a.kind) == \
            (b.mean_row_mav, b.max_row_mav, b.shape, b.layer, b.kind)
    # Rewrite the expert's weights with layer 0's q_proj changed: the cache must not answer.
    f = expert / "model.safetensors"
    tensors = load_file(str(f))
    tensors["model.layers.0.self_attn.q_proj.weight"] += 1.0
    save_file(tensors, str(f), metadata={"format": "pt"})
    again = delta_stats(tiny["base"], expert)
    assert not again.from_cache
    q = next(s for s in again.tensors if s.name == "model.layers.0.self_attn.q_proj.weight")
    assert q.mean_row_mav > 0.9
    assert delta_stats(tiny["base"], expert, cache=False).from_cache is False


def _rewrite(src: Path, dst: Path, edit):
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_mismatched_tensors_error_names_the_tensor(tiny, tmp_path):
    q = "model.layers.2.self_attn.q_proj.weight"
    missing = _rewrite(tiny["task"], tmp_path / "missing", lambda t: t.pop(q))
    with pytest.raises(DeltaMismatchError, match=r"model\.layers\.2\.self_attn\.q_proj\.weight"):
        delta_stats(tiny["base"], missing)
    extra = _rewrite(tiny["task"], tmp_path / "extra",
                     lambda t: t.__setitem__("model.layers.2.extra.weight", torch.zeros(3)))
    with pytest.raises(DeltaMismatchError, match=r"model\.layers\.2\.extra\.weight.*not in the base"):
        delta_stats(tiny["base"], extra)
    reshaped = _rewrite(tiny["task"], tmp_path / "reshaped",
                        lambda t: t.__setitem__(q, t[q][:, :32].contiguous()))
    with pytest.raises(DeltaMismatchError, match=r"q_proj\.weight: shape \[64, 32\] in the expert"):
        delta_stats(tiny["base"], reshaped)


def test_lora_adapter_stats_equal_the_merged_dense_model(tiny, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny["base"], dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                     layers_to_transform=[1, 6], rank_pattern={"down_proj": 2},
                     alpha_pattern={"down_proj": 3})
    peft_model = get_peft_model(model, cfg)
    torch.manual_seed(0)
    with torch.no_grad():  # PEFT initialises B to zero: plant a real (non-zero) adapter delta
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    peft_model.save_pretrained(tmp_path / "adapter")
    dense = peft_model.merge_and_unload()
    dense.save_pretrained(tmp_path / "dense")

    from_adapter = delta_stats(tiny["base"], tmp_path / "adapter", label="lora")
    from_dense = delta_stats(tiny["base"], tmp_path / "dense")
    assert from_adapter.label == "lora"
    assert [s.name for s in from_adapter.tensors] == [s.name for s in from_dense.tensors]
    changed = set()
    for a, d in zip(from_adapter.tensors, from_dense.tensors):
        np.testing.assert_allclose(a.row_mavs, d.row_mavs, rtol=1e-4, atol=1e-7, err_msg=a.name)
        if d.max_row_mav > 0:
            changed.add((a.layer, a.kind))
    assert changed == {(l, k) for l in (1, 6) for k in ("attn_q", "attn_v", "mlp_down")}
    # The provider hook directly, and its cache identity.
    provider = lora_delta_provider(tmp_path / "adapter")
    via_hook = delta_stats(tiny["base"], delta_provider=provider)
    assert via_hook.from_cache  # same adapter files as from_adapter
    assert provider("model.layers.0.self_attn.q_proj.weight") is None
    with pytest.raises(ValueError, match="either an expert"):
        delta_stats(tiny["base"], tiny["task"], delta_provider=provider)


def test_bad_delta_provider_shape_names_the_tensor(tiny):
    def provider(name):
        return torch.zeros(3, 3) if name.endswith("layers.4.mlp.up_proj.weight") else None
    threads = torch.get_num_threads()
    with pytest.raises(DeltaMismatchError, match=r"layers\.4\.mlp\.up_proj\.weight"):
        delta_stats(tiny["base"], delta_provider=provider)
    assert torch.get_num_threads() == threads  # the analysis restores torch's thread count


def test_csv_and_json_exports(tiny, tmp_path):
    st = delta_stats(tiny["base"], tiny["lang"], threshold=0.003, label="lang")
    text = st.to_csv(tmp_path / "s.csv")
    lines = text.strip().split("\n")
    assert lines[0].split(",")[:8] == ["expert", "name", "layer", "kind", "shape", "mean_row_mav",
                                       "max_row_mav", "frac_rows_above"]
    assert len(lines) == 1 + len(st.tensors)
    assert (tmp_path / "s.csv").read_text() == text
    doc = json.loads(st.to_json(tmp_path / "s.json"))
    assert doc["threshold"] == 0.003 and len(doc["tensors"]) == len(st.tensors)
    assert doc["layer_profile"] == pytest.approx(st.layer_profile().tolist())


def test_cli_analyze_and_suggest(tiny, tmp_path, capsys):
    from layerswap_core.cli import main

    out = tmp_path / "stats.csv"
    assert main(["analyze", "--base", str(tiny["base"]), "--expert", str(tiny["task"]),
                 "--expert", str(tiny["lang"]), "--threshold", "0.005", "--out", str(out)]) == 0
    lines = out.read_text().strip().split("\n")
    n = len(delta_stats(tiny["base"], tiny["task"]).tensors)
    assert len(lines) == 1 + 2 * n
    assert {l.split(",")[0] for l in lines[1:]} == {"task", "lang"}
    assert main(["analyze", "--base", str(tiny["base"]), "--expert", str(tiny["task"]),
                 "--out", str(tmp_path / "s.json")]) == 0
    assert len(json.loads((tmp_path / "s.json").read_text())["tensors"]) == n
    assert main(["analyze", "--base", str(tiny["base"]), "--expert", str(tiny["task"]),
                 "--out", str(tmp_path / "s.txt")]) == 2
    capsys.readouterr()
    assert main(["suggest", "--base", str(tiny["base"]), "--task", str(tiny["task"]),
                 "--lang", str(tiny["lang"])]) == 0
    printed = capsys.readouterr().out
    assert "bottom 2, top 1, transition bottom 0, transition top 0, partition none" in printed
    assert "--bottom 2 --top 1" in printed


# --------------------------------------------------------------------------- suggestion
def test_suggestion_recovers_the_tiny_family(tiny):
    task = delta_stats(tiny["base"], tiny["task"])
    lang = delta_stats(tiny["base"], tiny["lang"])
    s = suggest_config(task, lang, 8)
    assert (s.bottom, s.top, s.transition_bottom, s.transition_top, s.partition) == (2, 1, 0, 0, None)
    assert all(type(v) is int for v in (s.bottom, s.top, s.transition_bottom, s.transition_top))
    assert "0-1, 7" in s.explanation
    assert set(s.protected) <= {2, 3, 4, 5}
    from layerswap_core.merge.config import MergeConfig
    MergeConfig(**s.merge_config_kwargs()).validate(8)
    assert suggest_config(task, lang, 8) == s  # deterministic


@pytest.fixture(scope="module")
def base12(tmp_path_factory, embedded_base):
    return make_tiny_model(tmp_path_factory.mktemp("b12") / "base", seed=3, num_layers=12,
                           tokenizer_from=embedded_base)


def _experts(base, root, task_layers, lang_layers, task_kinds=None, lang_kinds=None, extra=None):
    task = make_expert(base, root / "task", seed=11, default_scale=0.02, kinds=task_kinds,
                       layer_scale={l: 0.3 for l in task_layers})
    lang_scale = {l: 0.3 for l in lang_layers}
    lang_scale.update(extra or {})
    lang = make_expert(base, root / "lang", seed=12, default_scale=0.02, kinds=lang_kinds,
                       layer_scale=lang_scale)
    return delta_stats(base, task), delta_stats(base, lang)


def test_suggestion_recovers_planted_blocks(base12, tmp_path):
    task, lang = _experts(base12, tmp_path, range(3, 10), [0, 1, 2, 10, 11])
    s = suggest_config(task, lang, 12)
    assert (s.bottom, s.top, s.transition_bottom, s.transition_top, s.partition) == (3, 2, 0, 0, None)
    assert len(s.advantage) == 12 and s.advantage[0] > 0 > s.advantage[5]


def test_suggestion_blends_a_layer_both_experts_changed(base12, tmp_path):
    # lang: 0, 1 and 11; task: 3..8; 9, 10 by neither; layer 2 by both, by the same share of
    # each expert's total change (task: 0.2 of 2.1 total scale, lang: 0.111 of 1.17).
    task = make_expert(base12, tmp_path / "task", seed=11, default_scale=0.02,
                       layer_scale={**{l: 0.3 for l in range(3, 9)}, 2: 0.2})
    lang = make_expert(base12, tmp_path / "lang", seed=12, default_scale=0.02,
                       layer_scale={0: 0.3, 1: 0.3, 11: 0.3, 2: 0.111})
    t, g = delta_stats(base12, task), delta_stats(base12, lang)
    s = suggest_config(t, g, 12)
    assert abs(s.advantage[2]) < 0.25 / 12, s.advantage
    assert (s.bottom, s.top, s.transition_bottom, s.transition_top) == (2, 1, 1, 0)
    assert "transition" in s.explanation


def test_suggestion_partition_a_for_attention_heavy_language_expert(base12, tmp_path):
    attention = {"attn_q", "attn_k", "attn_v", "attn_o"}
    task = make_expert(base12, tmp_path / "task", seed=11, default_scale=0.02,
                       kinds={"mlp_gate", "mlp_up", "mlp_down"},
                       layer_scale={l: 0.3 for l in range(2, 11)})
    lang = make_expert(base12, tmp_path / "lang", seed=12, default_scale=0.3, kinds=attention)
    s = suggest_config(delta_stats(base12, task), delta_stats(base12, lang), 12)
    assert s.partition == "A" and s.transition_bottom == s.transition_top == 0
    assert "partition A" in s.explanation and "own heuristic" in s.explanation


def test_suggestion_never_proposes_a_published_preset_that_does_not_fit(tiny, tmp_path):
    """Preset A is the first 6 + last 2 layers as published: on 8 layers it would leave no task
    layer, so an attention-heavy language expert gets a note instead of the preset."""
    attention = {"attn_q", "attn_k", "attn_v", "attn_o"}
    task = make_expert(tiny["base"], tmp_path / "task", seed=11, default_scale=0.02,
                       kinds={"mlp_gate", "mlp_up", "mlp_down"},
                       layer_scale={l: 0.3 for l in range(2, 7)})
    lang = make_expert(tiny["base"], tmp_path / "lang", seed=12, default_scale=0.3, kinds=attention)
    s = suggest_config(delta_stats(tiny["base"], task), delta_stats(tiny["base"], lang), 8)
    assert s.partition is None
    assert "does not fit 8 layers" in s.explanation


def test_suggestion_rejects_an_unchanged_expert(tiny):
    task = delta_stats(tiny["base"], tiny["task"])
    same = delta_stats(tiny["base"], tiny["base"])
    with pytest.raises(ValueError, match="language expert does not differ"):
        suggest_config(task, same, 8)
    with pytest.raises(ValueError, match="must agree"):
        suggest_config(task, task, 12)


def test_suggestion_on_a_30_layer_model(tmp_path, embedded_base):
    """Planted like the published setting: language in the first 6 and last 2 of 30 layers, task
    in 8..23; layers 6, 7 and 24..27 changed by neither beyond the common small drift (their
    shares differ only because the experts' totals do: they must not be swapped)."""
    base = make_tiny_model(tmp_path / "base", seed=4, num_layers=30, hidden=32,
                           tokenizer_from=embedded_base)
    task = make_expert(base, tmp_path / "task", seed=1, default_scale=0.01,
                       layer_scale={l: 0.1 for l in range(8, 24)})
    lang = make_expert(base, tmp_path / "lang", seed=2, default_scale=0.01,
                       layer_scale={**{l: 0.1 for l in range(6)}, 28: 0.1, 29: 0.1})
    t, g = delta_stats(base, task), delta_stats(base, lang)
    s = suggest_config(t, g, 30)
    assert (s.bottom, s.top, s.transition_bottom, s.transition_top, s.partition) == (6, 2, 0, 0, None)
    layers, kinds, frac = g.grid(kinds=MATRIX_KINDS)
    assert {layers[i] for i, _ in zip(*np.nonzero(frac > 0.5))} == {0, 1, 2, 3, 4, 5, 28, 29}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu(tiny):
    cpu = delta_stats(tiny["base"], tiny["task"], cache=False)
    gpu = delta_stats(tiny["base"], tiny["task"], device="cuda", cache=False)
    for a, b in zip(cpu.tensors, gpu.tensors):
        np.testing.assert_allclose(a.row_mavs, b.row_mavs, rtol=1e-5, atol=1e-9)


# --------------------------------------------------------------------------- a damaged cache
def _same_stats(a, b):
    assert [s.name for s in a.tensors] == [s.name for s in b.tensors]
    for x, y in zip(a.tensors, b.tensors):
        np.testing.assert_array_equal(x.row_mavs, y.row_mavs)
        assert (x.mean_row_mav, x.max_row_mav) == (y.mean_row_mav, y.max_row_mav)


def _cache_files() -> list[Path]:
    return sorted((Path(os.environ["LAYERSWAP_CACHE"]) / "deltas").iterdir())


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "inconsistent"])
def test_unreadable_cache_entry_is_discarded_and_recomputed(tiny, damage):
    first = delta_stats(tiny["base"], tiny["task"])
    (entry,) = _cache_files()
    data = entry.read_bytes()
    if damage == "inconsistent":  # a valid .npz whose rows do not fit its tensor list
        with np.load(entry) as z:
            np.savez(entry.with_suffix(""), meta=z["meta"], rows=z["rows"][:-1], offsets=z["offsets"])
    else:
        entry.write_bytes({"truncated": data[: len(data) // 2], "empty": b"",
                           "garbage": b"not a cache file " * 50}[damage])
    again = delta_stats(tiny["base"], tiny["task"])
    assert not again.from_cache
    _same_stats(again, first)
    assert _cache_files() == [entry]  # rewritten in place, no temporary files left
    hit = delta_stats(tiny["base"], tiny["task"])
    assert hit.from_cache
    _same_stats(hit, first)


@pytest.mark.parametrize("where", ["cache folder is a file", "cache root cannot be made"])
def test_unwritable_cache_still_returns_the_statistics(tiny, tmp_path, monkeypatch, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a folder should be")
    if where == "cache folder is a file":
        monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "c"))
        (tmp_path / "c").mkdir()
        (tmp_path / "c" / "deltas").write_text("")
    else:
        monkeypatch.setenv("LAYERSWAP_CACHE", str(blocker / "cache"))
    with pytest.warns(UserWarning, match="delta cache"):
        st = delta_stats(tiny["base"], tiny["task"])
    _same_stats(st, delta_stats(tiny["base"], tiny["task"], cache=False))


def test_failed_cache_write_leaves_no_file_and_returns_the_statistics(tiny, monkeypatch):
    """Disk full in the middle of writing: no entry and no temporary file remain."""
    import errno

    def disk_full(f, **arrays):
        f.write(b"PK\x03\x04 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(analysis.np, "savez", disk_full)
    with pytest.warns(UserWarning, match="No space left"):
        st = delta_stats(tiny["base"], tiny["task"])
    assert not st.from_cache and len(st.tensors) > 0
    assert _cache_files() == []


def test_adapter_with_invalid_config_names_the_file(tiny, tmp_path):
    from layerswap_core.checkpoints.adapters import AdapterError

    d = tmp_path / "adapter"
    d.mkdir()
    (d / "adapter_config.json").write_text("{broken")
    with pytest.raises(AdapterError, match=f"{d / 'adapter_config.json'}: not valid JSON"):
        delta_stats(tiny["base"], d)
