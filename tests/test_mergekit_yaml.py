"""mergekit YAML out and in (``merge/mergekit_yaml.py``): what layerswap writes, mergekit merges
into the same tensors; what mergekit reads, layerswap reads back; what it cannot express is
refused with the reason."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.cli import main
from layerswap_core.merge.config import MergeConfig
from layerswap_core.merge.errors import ConfigError
from layerswap_core.merge.executor import merge_to_folder
from layerswap_core.merge.mergekit_yaml import Opened, from_mergekit, mergekit_file, to_mergekit
from layerswap_core.merge.registry import concrete
from layerswap_core.testing import mergekit_yaml, run_mergekit

L = 8  # layers of the tiny fixture

# every method mergekit can express, with weights whose blends are bit-identical
EXPRESSIBLE = {
    # transitions and averaged non-layer parameters: linear slices, empty slices at both ends
    "swap_blend": MergeConfig(bottom=2, top=1, transition_bottom=1, transition_top=1,
                              w_task=0.3, w_lang=0.5),
    # copies only, non-layer parameters from the task expert: passthrough
    "swap_task": MergeConfig(bottom=2, top=1, non_layer="task"),
    # a whole-layer partition: slices; the embeddings and norm from the language expert
    "partition": MergeConfig(partition=[{"layers": "0-2"}, {"layers": "non-layer"}]),
    "soup": MergeConfig(method="soup", w_task=3.0, w_lang=1.0),
    "task_arithmetic": MergeConfig(method="task_arithmetic", lambda_task=0.8, lambda_lang=0.6),
    "ties": MergeConfig(method="ties", ties_density=0.3, ties_lambda=0.9),
}


def tensors(folder) -> dict[str, torch.Tensor]:
    r = CheckpointReader(folder)
    return {n: r.get(n) for n in r.names()}


def models(tiny, cfg):
    return {"task": str(tiny["task"]), "lang": str(tiny["lang"]),
            **({"base": str(tiny["base"])} if cfg.needs_base else {})}


def at_trim_cut(states, name, density):
    """Entries whose |delta| ties with the tensor's TIES trim threshold (for either expert)."""
    base = states["base"][name].float()
    cut = torch.zeros(base.shape, dtype=torch.bool)
    for role in ("task", "lang"):
        mags = (states[role][name].float() - base).abs()
        k = max(1, int(density * mags.numel()))
        cut |= mags == mags.reshape(-1).sort(descending=True).values[k - 1]
    return cut


def test_emitted_yaml_merges_in_mergekit_to_the_same_tensors(tiny, tmp_path):
    """For every expressible method: layerswap's merge == mergekit-yaml of the emitted YAML,
    every tensor (TIES: all but the entries tied with a trim threshold, as the note says)."""
    if mergekit_yaml() is None:
        pytest.skip("mergekit is not installed")
    jobs, ours, notes = [], {}, {}
    for name, cfg in EXPRESSIBLE.items():
        refs = models(tiny, cfg)
        text, notes[name] = to_mergekit(cfg, **refs)
        (tmp_path / f"{name}.yaml").write_text(text)
        jobs.append((tmp_path / f"{name}.yaml", tmp_path / f"mk_{name}"))
        ours[name] = tensors(merge_to_folder(cfg, out=tmp_path / f"ours_{name}", **refs))
    # the blend at 0.3 : 0.7 is the same merge, not the same bits (the note says why)
    soft = MergeConfig(method="soup", w_task=0.3, w_lang=0.7)
    text, soft_notes = to_mergekit(soft, task=tiny["task"], lang=tiny["lang"])
    assert any("last bit" in n for n in soft_notes)
    (tmp_path / "soft.yaml").write_text(text)
    jobs.append((tmp_path / "soft.yaml", tmp_path / "mk_soft"))
    run_mergekit(jobs)

    states = {role: tensors(p) for role, p in tiny.items()}
    for name, mine in ours.items():
        theirs = tensors(tmp_path / f"mk_{name}")
        assert set(theirs) == set(mine), name
        for n, t in mine.items():
            assert t.dtype == theirs[n].dtype, (name, n)
            if name == "ties":
                keep = ~at_trim_cut(states, n, 0.3)
                assert torch.equal(t[keep], theirs[n][keep]), (name, n)
            else:
                assert torch.equal(t, theirs[n]), (name, n)
        assert not [x for x in notes[name] if "last bit" in x], name
    assert any("trim threshold" in x for x in notes["ties"])
    # the planted experts differ: the merges are not trivially equal to one input
    assert not torch.equal(ours["swap_blend"]["model.embed_tokens.weight"],
                           states["task"]["model.embed_tokens.weight"])
    assert torch.equal(ours["swap_task"]["model.embed_tokens.weight"],
                       states["task"]["model.embed_tokens.weight"])
    mine = tensors(merge_to_folder(soft, task=tiny["task"], lang=tiny["lang"],
                                   out=tmp_path / "ours_soft"))
    theirs = tensors(tmp_path / "mk_soft")
    for n, t in mine.items():
        torch.testing.assert_close(t, theirs[n], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["swap_blend", "swap_task", "soup", "task_arithmetic", "ties"])
def test_round_trip_gives_the_same_config(tiny, name):
    """ours -> mergekit YAML -> ours: the config as merged (layer counts and dtype explicit)."""
    cfg = replace(EXPRESSIBLE[name], **models(tiny, EXPRESSIBLE[name]))
    text, _ = to_mergekit(cfg)
    want = replace(concrete(cfg, L), dtype="float32")
    assert from_mergekit(text) == want
    assert from_mergekit(text, num_layers=L) == want


def test_round_trip_of_the_default_swap_and_of_a_lang_non_layer(tiny):
    for cfg in (MergeConfig(), MergeConfig(bottom=1, top=2, transition_top=1, non_layer="lang",
                                           w_task=2.0, w_lang=1.0, dtype="bfloat16")):
        cfg = replace(cfg, task=str(tiny["task"]), lang=str(tiny["lang"]))
        text, _ = to_mergekit(cfg)
        assert from_mergekit(text) == replace(concrete(cfg, L), dtype=cfg.dtype or "float32")


@pytest.mark.parametrize("cfg, why", [
    (MergeConfig(transition_top=1, magnitude_weights=True), "magnitude-adjusted weights"),
    (MergeConfig(method="magnitude_soup"), "magnitude-adjusted weights"),
    (MergeConfig(method="soup", magnitude_weights=True), "magnitude-adjusted weights"),
    (MergeConfig(partition="A", scale_partition=True), r"splits layer \d+ by module kind"),
])
def test_unexpressible_configs_are_refused_with_the_reason(tiny, cfg, why):
    refs = {"task": tiny["task"], "lang": tiny["lang"], "base": tiny["base"]}
    with pytest.raises(ConfigError, match=why) as e:
        to_mergekit(cfg, **refs)
    assert "\n" not in str(e.value)
    from layerswap_core.checkpoints.compatibility import open_models
    name, text = mergekit_file(cfg, Opened.of(open_models({k: str(v) for k, v in refs.items()})))
    # the Build tab's zip: the reason, as a note file
    assert name == "mergekit-not-expressible.txt" and re.search(why, text)


def test_cli_emit_mergekit_alone_and_refused(tiny, tmp_path, capsys):
    f = tmp_path / "mk.yaml"
    args = ["merge", "--task", str(tiny["task"]), "--lang", str(tiny["lang"]), "--bottom", "2",
            "--top", "1", "--w-task", "0.3", "--w-lang", "0.7", "--transition-top", "1"]
    assert main([*args, "--emit-mergekit", str(f)]) == 0
    out = capsys.readouterr().out
    assert "note: blend weights 0.3 : 0.7" in out and not (tmp_path / "out").exists()
    assert from_mergekit(f.read_text()) == replace(
        MergeConfig(bottom=2, top=1, transition_top=1, w_task=0.3, w_lang=0.7, dtype="float32"),
        task=str(tiny["task"]), lang=str(tiny["lang"]))
    assert main([*args[:7], "--transition-top", "1", "--magnitude-weights", "--base",
                 str(tiny["base"]), "--emit-mergekit", str(tmp_path / "no.yaml")]) != 0
    err = capsys.readouterr().err.strip()
    assert "magnitude-adjusted weights" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "no.yaml").exists()
    assert main(args) != 0 and "--out" in capsys.readouterr().err


HAND_WRITTEN = """\
merge_method: passthrough
base_model: {task}
dtype: bfloat16
slices:
  - sources: [{{model: {lang}, layer_range: [0, 3]}}]
  - sources: [{{model: {task}, layer_range: [3, 6]}}]
  - sources: [{{model: {lang}, layer_range: [6, 8]}}]
"""


def test_from_mergekit_of_a_hand_written_yaml(tiny, tmp_path, capsys):
    f = tmp_path / "hand.yaml"
    f.write_text(HAND_WRITTEN.format(task=tiny["task"], lang=tiny["lang"]))
    assert main(["plan", "--from-mergekit", str(f), "--show-config"]) == 0
    shown = MergeConfig.from_yaml(capsys.readouterr().out.split("\n\n", 1)[1])
    assert shown == MergeConfig(bottom=3, top=2, non_layer="lang", dtype="bfloat16",
                                task=str(tiny["task"]), lang=str(tiny["lang"]))
    # flags override it; a model of another depth is refused
    assert main(["plan", "--from-mergekit", str(f), "--top", "1", "--show-config"]) == 0
    assert "top: 1\n" in capsys.readouterr().out
    f.write_text(HAND_WRITTEN.format(task=tiny["task"], lang=tiny["lang"]).replace(
        "[6, 8]", "[6, 7]"))
    assert main(["plan", "--from-mergekit", str(f)]) != 0
    assert "the slices cover 7 layers, the model has 8" in capsys.readouterr().err


@pytest.mark.parametrize("text, why", [
    ("merge_method: slerp\nmodels: [{model: a}, {model: b}]\n", "'slerp' has no layerswap"),
    ("merge_method: linear\nmodels: [{model: a}, {model: b}, {model: c}]\n", "exactly two models"),
    ("merge_method: passthrough\nslices:\n- sources: [{model: a, layer_range: [0, 2]}]\n",
     "without base_model"),
    ("merge_method: passthrough\nbase_model: t\nslices:\n"
     "- sources: [{model: a, layer_range: [0, 2]}]\n- sources: [{model: t, layer_range: [0, 2]}]\n",
     "keeps every layer in place"),
    ("merge_method: passthrough\nbase_model: t\nslices:\n"
     "- sources: [{model: t, layer_range: [0, 2]}]\n- sources: [{model: a, layer_range: [2, 4]}]\n"
     "- sources: [{model: t, layer_range: [4, 6]}]\n", "layer-swap pattern"),
    ("merge_method: linear\nmodels:\n- {model: a, parameters: {weight: [0, 1]}}\n"
     "- {model: b, parameters: {weight: 1}}\n", "filters and gradients"),
    ("merge_method: ties\nbase_model: z\nmodels:\n- {model: a, parameters: {weight: 1, density: 0.5}}\n"
     "- {model: b, parameters: {weight: 1, density: 0.3}}\n", "weighs the two experts alike"),
    ("merge_method: linear\ntokenizer_source: union\nmodels: [{model: a}, {model: b}]\n",
     "tokenizer_source not supported"),
])
def test_from_mergekit_refuses_what_it_cannot_map(text, why):
    with pytest.raises(ConfigError, match=why) as e:
        from_mergekit(text)
    assert "\n" not in str(e.value)


def test_from_mergekit_maps_the_methods():
    assert from_mergekit("merge_method: task_arithmetic\nbase_model: z\nparameters: {lambda: 0.5}\n"
                         "models:\n- {model: a, parameters: {weight: 1.0}}\n"
                         "- {model: b, parameters: {weight: 0.4}}\n") == MergeConfig(
        method="task_arithmetic", lambda_task=0.5, lambda_lang=0.2, task="a", lang="b", base="z")
    assert from_mergekit("merge_method: ties\nbase_model: z\nparameters: {density: 0.4}\n"
                         "models:\n- {model: a, parameters: {weight: 1}}\n"
                         "- {model: b, parameters: {weight: 1}}\n") == MergeConfig(
        method="ties", ties_density=0.4, task="a", lang="b", base="z")
