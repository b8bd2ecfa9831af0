"""Faithful to the papers: Algorithm 1 with averaged non-layer parameters, TIES as mergekit does
it, and every bad numeric or structural config value refused with one line naming the field."""
from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from layerswap_core.merge import method_ties
from layerswap_core.workbench import figures as plots
from layerswap_core.checkpoints.architectures import get_architecture
from layerswap_core.cli import main
from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.merge.config import MergeConfig
from layerswap_core.merge.plan import build_plan
from layerswap_core.testing import mergekit_yaml

L = 8  # layers of the tiny fixture


def tensors(folder) -> dict[str, torch.Tensor]:
    r = CheckpointReader(folder)
    return {n: r.get(n) for n in r.names()}


def layer_of(name: str):
    return int(name.split(".")[2]) if name.startswith("model.layers.") else None


@pytest.fixture(scope="module")
def states(tiny):
    return {role: tensors(p) for role, p in tiny.items()}


def algorithm_1(task, lang, b, u, tb, tu, wt, wl, non_layer, dtype=None):
    """Algorithm 1 written out: per-layer zones; non-layer tensors averaged (or copied)."""
    def blend(n):
        out = (wt * task[n].float() + wl * lang[n].float()) / (wt + wl)
        return out.to(dtype or task[n].dtype)

    def copy(src, n):
        return src[n].to(dtype or task[n].dtype)

    out = {}
    for n in task:
        layer = layer_of(n)
        if layer is None:
            src = task if non_layer == "task" else lang
            out[n] = blend(n) if non_layer == "blend" else copy(src, n)
        elif layer < b or layer >= L - u:
            out[n] = copy(lang, n)
        elif layer < b + tb or layer >= L - u - tu:
            out[n] = blend(n)
        else:
            out[n] = copy(task, n)
    return out


def test_cli_merge_with_defaults_is_algorithm_1_with_averaged_non_layer(tiny, states, tmp_path):
    out = tmp_path / "default"
    assert main(["merge", "--task", str(tiny["task"]), "--lang", str(tiny["lang"]),
                 "--out", str(out)]) == 0
    merged = tensors(out)
    # the tool's default layer counts: 5 bottom / 2 top of 32, scaled to 8 layers, half up
    b, u = math.floor(5 * L / 32 + 0.5), math.floor(2 * L / 32 + 0.5)
    saved = MergeConfig.load(out / "layerswap.yaml")
    assert (saved.bottom, saved.top, saved.non_layer) == (b, u, "blend")
    ref = algorithm_1(states["task"], states["lang"], b, u, 0, 0, 1.0, 1.0, "blend")
    assert merged.keys() == ref.keys() and "lm_head.weight" not in merged  # tied head
    for n, t in merged.items():
        assert t.dtype == ref[n].dtype and torch.equal(t, ref[n]), n
    glob = sorted(n for n in merged if layer_of(n) is None)
    assert glob == ["model.embed_tokens.weight", "model.norm.weight"]
    for n in glob:  # averaged: neither expert's tensor
        assert not torch.equal(merged[n], states["task"][n])
        assert not torch.equal(merged[n], states["lang"][n])
    card = (out / "README.md").read_text()
    assert "non-layer parameters averaged" in card and "non-layer blend 0.50/0.50" in card
    # the tied LM head of the loaded model is the averaged embedding
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(model.lm_head.weight.detach(), ref["model.embed_tokens.weight"])


@pytest.mark.parametrize("non_layer", ["blend", "task", "lang"])
def test_cli_non_layer_weights_transitions_and_output_dtype(tiny, states, tmp_path, non_layer):
    out = tmp_path / non_layer
    assert main(["merge", "--task", str(tiny["task"]), "--lang", str(tiny["lang"]),
                 "--bottom", "2", "--top", "1", "--transition-bottom", "1", "--transition-top", "1",
                 "--w-task", "3", "--w-lang", "1", "--dtype", "bfloat16",
                 "--non-layer", non_layer, "--out", str(out)]) == 0
    merged = tensors(out)
    ref = algorithm_1(states["task"], states["lang"], 2, 1, 1, 1, 3.0, 1.0, non_layer,
                      torch.bfloat16)
    for n, t in merged.items():
        assert t.dtype == torch.bfloat16 and torch.equal(t, ref[n]), n
    if non_layer != "blend":  # exact copies of the chosen expert
        src = states[non_layer]
        assert torch.equal(merged["model.norm.weight"], src["model.norm.weight"].bfloat16())
    assert MergeConfig.load(out / "layerswap.yaml").non_layer == non_layer


def test_live_model_averages_the_non_layer_parameters_in_memory(tiny, states):
    from layerswap_core.merge.live import LiveModel
    live = LiveModel.from_refs(tiny["task"], tiny["lang"], dtype=torch.float32)
    params = dict(live.model.named_parameters())
    live.show(MergeConfig(bottom=2, top=1, w_task=1.0, w_lang=3.0))
    ref = algorithm_1(states["task"], states["lang"], 2, 1, 0, 0, 1.0, 3.0, "blend")
    for n in ("model.embed_tokens.weight", "model.norm.weight",
              "model.layers.0.mlp.up_proj.weight"):
        assert torch.equal(params[n].detach(), ref[n]), n
    assert torch.equal(live.model.lm_head.weight.detach(), ref["model.embed_tokens.weight"])
    cfg = MergeConfig(bottom=2, top=1, w_task=1.0, w_lang=3.0, non_layer="task")
    assert sorted(live.plan_for(cfg).changed_names(live.plan)) == ["model.embed_tokens.weight",
                                                                   "model.norm.weight"]
    assert live.show(cfg).rewritten == 2
    assert torch.equal(params["model.norm.weight"].detach(), states["task"]["model.norm.weight"])


# --------------------------------------------------------------------------- TIES
def test_ties_exact_tie_of_summed_signs_counts_as_positive():
    """mergekit's TIES (consensus "sum"): sign = (sum >= 0) * 2 - 1, so a sum of exactly 0
    elects +: the positive deltas are kept, the negative ones dropped."""
    base = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0])
    task = base + torch.tensor([2.0, -0.5, 0.0, 3.0, -1.0])
    lang = base + torch.tensor([-2.0, 0.5, 0.0, -1.0, -1.0])
    #          sums:               0     0    0     2    -2
    #        elected:              +     +    +     +    -
    out = method_ties.ties([base, task, lang], [1.0, 1.0], density=1.0, lam=0.5)
    expect = base + 0.5 * torch.tensor([2.0, 0.5, 0.0, 3.0, -1.0])
    assert torch.equal(out, expect)
    # with trimming (per tensor): density 0.4 keeps 2 of 5 entries of each delta
    out = method_ties.ties([base, task, lang], [1.0, 1.0], density=0.4, lam=1.0)
    # task keeps 3.0, 2.0; lang keeps -2.0, -1.0 (|-1| ties with |-1| at index 4 -> kept too)
    trimmed_t = torch.tensor([2.0, 0.0, 0.0, 3.0, 0.0])
    trimmed_l = torch.tensor([-2.0, 0.0, 0.0, -1.0, -1.0])
    total = trimmed_t + trimmed_l                           # [0, 0, 0, 2, -1]
    assert total.tolist() == [0.0, 0.0, 0.0, 2.0, -1.0]
    expect = base + torch.tensor([2.0, 0.0, 0.0, 3.0, -1.0])  # tie at 0 -> + -> task's 2.0
    assert torch.equal(out, expect)


@pytest.mark.parametrize("kw,msg", [
    (dict(density=0.0), "density must be in"), (dict(density=1.5), "density must be in"),
    (dict(density=float("nan")), "density must be in"), (dict(lam=float("inf")), "lambda"),
    (dict(lam=float("nan")), "lambda")])
def test_ties_refuses_bad_density_and_lambda(kw, msg):
    t = torch.ones(3)
    with pytest.raises(ValueError, match=msg):
        method_ties.ties([t, t, t], [1.0, 1.0], **{"density": 0.5, "lam": 1.0, **kw})


def _tie_trio(tiny, root: Path) -> dict[str, Path]:
    """The tiny trio with one tensor whose task and language deltas cancel exactly."""
    from safetensors.torch import save_file
    n = "model.layers.3.mlp.up_proj.weight"
    out = {}
    for role in ("base", "task", "lang"):
        out[role] = Path(shutil.copytree(tiny[role], root / role))
    d = tensors(tiny["task"])[n] - tensors(tiny["base"])[n]
    values = {"base": torch.zeros_like(d), "task": d, "lang": -d}
    for role, folder in out.items():
        (f,) = sorted(folder.glob("*.safetensors"))
        t = tensors(folder)
        t[n] = values[role].contiguous()
        f.unlink()
        save_file(t, str(f), metadata={"format": "pt"})
    return out


def test_ties_tie_case_in_a_merge_and_against_mergekit(tiny, tmp_path):
    trio = _tie_trio(tiny, tmp_path)
    n = "model.layers.3.mlp.up_proj.weight"
    density = 0.3
    ours = tmp_path / "ours"
    assert main(["merge", "--method", "ties", "--ties-density", str(density), "--task",
                 str(trio["task"]), "--lang", str(trio["lang"]), "--base", str(trio["base"]),
                 "--out", str(ours)]) == 0
    got = tensors(ours)
    d = tensors(trio["task"])[n]
    kept = d.abs() >= d.abs().reshape(-1).sort(descending=True).values[int(density * d.numel()) - 1]
    # every sum is exactly 0 -> positive elected: the positive one of (d, -d) where kept
    assert torch.equal(got[n], d.abs() * kept)
    mergekit = mergekit_yaml()
    if mergekit is None:
        pytest.skip("mergekit is not installed (cross-check skipped)")
    (tmp_path / "mk.yaml").write_text(
        f"merge_method: ties\nbase_model: {trio['base']}\ndtype: float32\n"
        "parameters: {normalize: true}\nmodels:\n"
        f"  - model: {trio['task']}\n    parameters: {{weight: 1.0, density: {density}}}\n"
        f"  - model: {trio['lang']}\n    parameters: {{weight: 1.0, density: {density}}}\n")
    subprocess.run([mergekit, str(tmp_path / "mk.yaml"), str(tmp_path / "mk")], check=True,
                   capture_output=True)
    theirs = tensors(tmp_path / "mk")
    assert torch.equal(theirs[n], got[n])
    states = {role: tensors(p) for role, p in trio.items()}
    for name, t in got.items():
        # Entries whose |delta| ties with the trim threshold may differ: we keep every tied
        # entry, mergekit exactly k of them (by sort order). Everything else agrees.
        at_cut = torch.zeros(t.shape, dtype=torch.bool)
        for role in ("task", "lang"):
            mags = (states[role][name].float() - states["base"][name].float()).abs()
            k = max(1, int(density * mags.numel()))
            at_cut |= mags == mags.reshape(-1).sort(descending=True).values[k - 1]
        assert at_cut.sum() <= max(8, at_cut.numel() // 1000), name
        torch.testing.assert_close(t[~at_cut], theirs[name][~at_cut], rtol=1e-6, atol=1e-6,
                                   msg=name)


# --------------------------------------------------------------------------- refusals
def last_line(capsys) -> str:
    """The CLI's error: one line (after any progress bar), no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1].split("\r")[-1]
    assert line.startswith("layerswap ") and ": error: " in line, err
    return line


@pytest.mark.parametrize("flags,msg", [
    (["--lambda-task", "nan"], "lambda_task: must be a number from -100 to 100, got nan"),
    (["--ties-lambda", "inf"], "ties_lambda: must be a number from -100 to 100, got inf"),
    (["--w-task", "1e39"], "w_task: must be a number from 0 to 10000"),
    (["--ties-density", "0"], "ties_density: must be a number in (0, 1]"),
    (["--partition", "C"], "partition preset C: first 6 + last 2 layers as published"),
    (["--partition", "not-a-preset"], "give A, B, C or a YAML file of rules"),
])
def test_cli_refuses_bad_values_in_one_line(tiny, tmp_path, capsys, flags, msg):
    out = tmp_path / "m"
    rc = main(["merge", "--task", str(tiny["task"]), "--lang", str(tiny["lang"]),
               "--out", str(out), *flags])
    assert rc == 2 and msg in last_line(capsys), msg
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text,msg", [
    ("w_lang: .inf\n", "w_lang: must be a number from 0 to 10000"),
    ("lambda_lang: 1e39\nmethod: task_arithmetic\n", "lambda_lang: must be a number from -100"),
    ("transition_bottom: null\n", "transition_bottom: must be a non-negative integer, got null"),
    ('ties_density: "0.5"\n', "ties_density: must be a number in (0, 1]"),
    ("partition: 5\n", "partition: must be a preset name"),
    ("partition:\n  - {layers: 0-20000000, kinds: mlp}\n",
     "layer selection '0-20000000' is outside the model's layers 0..7"),
])
def test_cli_refuses_bad_yaml_in_one_line(tiny, tmp_path, capsys, text, msg):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    rc = main(["merge", "--config", str(cfg), "--task", str(tiny["task"]), "--lang",
               str(tiny["lang"]), "--out", str(tmp_path / "m")])
    assert rc == 2 and msg in last_line(capsys), msg
    assert not (tmp_path / "m").exists()


def test_cli_partition_rules_file_addresses_non_layer_and_is_bounded(tiny, tmp_path, capsys):
    rules = tmp_path / "rules.yaml"
    rules.write_text("- {layers: '0-1'}\n- {layers: non-layer, to: lang}\n")
    assert main(["plan", "--task", str(tiny["task"]), "--partition", str(rules)]) == 0
    text = capsys.readouterr().out
    assert "0-1       lang" in text and "non-layer lang: model.embed_tokens, model.norm" in text
    rules.write_text("- {layers: 0-20000000, kinds: mlp}\n")
    assert main(["plan", "--task", str(tiny["task"]), "--partition", str(rules)]) == 2
    assert "outside the model's layers 0..7" in capsys.readouterr().err
    rules.write_text("- {layers: [unclosed\n")
    assert main(["plan", "--task", str(tiny["task"]), "--partition", str(rules)]) == 2
    assert "is not valid YAML" in last_line(capsys)
    assert main(["plan", "--task", str(tiny["task"]), "--partition", "c", "--scale-partition",
                 "--non-layer", "lang"]) == 0
    text = capsys.readouterr().out
    assert "partition C (first 2 + last 1 of 8 layers, scaled" in text
    assert "from the language expert (non_layer: lang)" in text


# --------------------------------------------------------------------------- layer diagram
def test_layer_diagram_shows_where_the_non_layer_parameters_come_from(tiny):
    reader = CheckpointReader(tiny["task"])
    arch = get_architecture(reader.config())
    names = reader.names()
    plan = build_plan(MergeConfig(bottom=2, top=1, w_task=3.0, w_lang=1.0), names, arch)
    fig = plots.layer_stack_figure(plan.layer_rows(), non_layer=plan.non_layer_sources())
    by_name = {tr.name: tr for tr in fig.data}
    lang, task = by_name["language expert"], by_name["task expert"]
    assert list(lang.y) == [-1] + list(range(L))
    assert (lang.x[0], task.x[0]) == pytest.approx((0.25, 0.75))  # blend 3 : 1
    assert "non-layer" in fig.layout.yaxis.ticktext
    notes = [a.text for a in fig.layout.annotations]
    assert "non-layer: blend 0.75/0.25<br>(embeddings, final norm, LM head)" in notes  # 2 lines
    assert "model.embed_tokens" in lang.customdata[0]
    plan = build_plan(MergeConfig(bottom=2, top=1, non_layer="task"), names, arch)
    fig = plots.layer_stack_figure(plan.layer_rows(), non_layer=plan.non_layer_sources())
    assert "non-layer: task expert<br>(embeddings, final norm, LM head)" in \
        [a.text for a in fig.layout.annotations]
    plain = plots.layer_stack_figure(plan.layer_rows())  # without: the layers only
    assert list(plain.data[0].y) == list(range(L))
