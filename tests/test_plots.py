"""Figures are built from the right data: check traces, axes and layout (not pixels)."""
from __future__ import annotations

import numpy as np
import pytest

from layerswap_core.workbench import figures as plots
from layerswap_core.analysis.deltas import DeltaStats, TensorStats, delta_stats
from layerswap_core.analysis.suggest import suggest_config
from layerswap_core.checkpoints.architectures import LAYER_KIND_ORDER, get_architecture
from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.merge.config import MergeConfig
from layerswap_core.merge.plan import build_plan


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def stats(tiny):
    return (delta_stats(tiny["base"], tiny["task"], label="task"),
            delta_stats(tiny["base"], tiny["lang"], label="lang"))


@pytest.fixture
def tiny_arch(tiny):
    r = CheckpointReader(tiny["task"])
    return r.names(), get_architecture(r.config())


def synthetic_stats(num_layers: int, label: str, strong: set[int]) -> DeltaStats:
    """DeltaStats of a 30-layer Llama-like expert, built directly (no model needed for a figure)."""
    kinds = {"self_attn.q_proj": "attn_q", "self_attn.o_proj": "attn_o",
             "mlp.down_proj": "mlp_down", "input_layernorm": "norm_attn"}
    rng = np.random.default_rng(0)
    tensors = []
    for l in range(num_layers):
        for suffix, kind in kinds.items():
            rows = 1 if kind.startswith("norm") else 16
            scale = 1e-2 if l in strong else 1e-4
            mav = np.sort(rng.uniform(0.5, 1.5, rows) * scale).astype(np.float32)
            tensors.append(TensorStats(f"model.layers.{l}.{suffix}.weight", l, kind,
                                       (rows, 8) if rows > 1 else (8,), float(mav.mean()),
                                       float(mav[-1]), mav))
    return DeltaStats("base", label, "llama", num_layers, tensors, threshold=1e-3, label=label)


def test_fraction_heatmap_axes_and_values(stats):
    task, _ = stats
    fig = plots.delta_heatmap(task, tau=0.005)
    (tr,) = fig.data
    layers, kinds, z = task.grid("frac_rows_above", 0.005)
    assert list(tr.y) == list(range(8)) and layers == list(range(8))  # layer 0 first = bottom
    assert fig.layout.yaxis.autorange in (None, True)  # not reversed: layer 0 at the bottom
    assert list(tr.x) == [plots.KIND_LABELS[k] for k in kinds]
    assert kinds == [k for k in LAYER_KIND_ORDER if k in kinds]  # display order, present only
    np.testing.assert_array_equal(np.array(tr.z, dtype=float), z)
    assert (tr.zmin, tr.zmax) == (0.0, 1.0)
    assert "0.005" in fig.layout.title.text and fig.layout.yaxis.title.text == "layer"
    assert "mean row MAV" in tr.hovertemplate
    custom = np.array(tr.customdata, dtype=float)
    np.testing.assert_allclose(custom[..., 1], task.grid("mean_row_mav")[2])


def test_mav_heatmap_log_scale(stats):
    task, _ = stats
    fig = plots.mav_heatmap(task)
    z = np.array(fig.data[0].z, dtype=float)
    np.testing.assert_allclose(z, np.log10(task.grid("mean_row_mav")[2]))
    assert "log" in fig.data[0].colorbar.title.text
    lin = plots.mav_heatmap(task, log=False)
    np.testing.assert_allclose(np.array(lin.data[0].z, dtype=float), task.grid("mean_row_mav")[2])


def test_side_by_side_shares_one_colour_scale(stats):
    task, lang = stats
    fig = plots.side_by_side_heatmaps(task, lang, metric="mean_row_mav", log=True, tau=0.005)
    assert len(fig.data) == 2
    assert {tr.coloraxis for tr in fig.data} == {"coloraxis"}
    allz = np.concatenate([np.array(tr.z, dtype=float).ravel() for tr in fig.data])
    allz = allz[np.isfinite(allz)]
    assert fig.layout.coloraxis.cmin == pytest.approx(allz.min())
    assert fig.layout.coloraxis.cmax == pytest.approx(allz.max())
    assert [a.text for a in fig.layout.annotations] == ["task", "lang"]


def test_overlap_is_the_minimum_of_both_fractions(stats):
    task, lang = stats
    fig = plots.overlap_heatmap(task, lang, tau=0.001)
    _, _, ft = task.grid("frac_rows_above", 0.001)
    _, _, fl = lang.grid("frac_rows_above", 0.001)
    np.testing.assert_array_equal(np.array(fig.data[0].z, dtype=float), np.fmin(ft, fl))
    at_auto = plots.overlap_heatmap(task, lang, tau=0.005)
    # At the automatic threshold the planted experts never overlap: nothing at risk.
    assert np.nanmax(np.array(at_auto.data[0].z, dtype=float)) == 0


def test_plan_heatmap_colours_each_cell_by_its_source(tiny_arch, stats):
    names, arch = tiny_arch
    plan = build_plan(MergeConfig(bottom=2, top=1, transition_bottom=1, transition_top=0),
                      names, arch)
    cells = plan.cells()
    fig = plots.plan_heatmap(cells, 8)
    tr = fig.data[0]
    ticktext = list(tr.colorbar.ticktext)
    z = np.array(tr.z, dtype=float)
    kinds = [k for k in LAYER_KIND_ORDER if k in {k for _, k in cells}]
    for (l, k), src in cells.items():
        assert ticktext[int(z[l, kinds.index(k)])] == plots.SOURCE_NAMES[src]
    assert tr.text[0][0] == "L" and tr.text[2][0] == "½" and tr.text[4][0] == "T"
    over = plots.plan_heatmap(cells, 8, stats=stats[1], tau=0.005)
    np.testing.assert_array_equal(np.array(over.data[0].z, dtype=float),
                                  stats[1].grid("frac_rows_above", 0.005, kinds)[2])
    assert over.data[0].text[7][0] == "L"


def test_layer_stack_from_plan_rows_and_dicts(tiny_arch):
    names, arch = tiny_arch
    plan = build_plan(MergeConfig(bottom=2, top=1, transition_bottom=1, transition_top=1,
                                  w_task=0.6, w_lang=0.4), names, arch)
    fig = plots.layer_stack_figure(plan.layer_rows())
    by_name = {tr.name: tr for tr in fig.data}
    lang, task = by_name["language expert"], by_name["task expert"]
    assert list(lang.y) == list(range(8))
    np.testing.assert_allclose(lang.x, [1, 1, 0.4, 0, 0, 0, 0.4, 1])
    np.testing.assert_allclose(task.x, [0, 0, 0.6, 1, 1, 1, 0.6, 0])
    assert fig.layout.barmode == "stack" and fig.layout.height >= 300
    zones = [a.text for a in fig.layout.annotations]  # one label per run of equal layers
    assert zones == ["language expert ×2", "blend 0.60/0.40", "task expert ×3",
                     "blend 0.60/0.40", "language expert"]
    rows = [{"layer": l, "source": "lang" if l < 3 else "task", "w_task": float(l >= 3),
             "w_lang": float(l < 3), "label": "x"} for l in range(30)]
    fig30 = plots.layer_stack_figure(rows, names={"lang": "Swahili", "task": "math"})
    assert {tr.name for tr in fig30.data} == {"Swahili", "math"}
    assert fig30.layout.height >= 20 * 30
    part = build_plan(MergeConfig(partition="A", scale_partition=True), names, arch)
    figA = plots.layer_stack_figure(part.layer_rows())
    lang_x = dict(zip(figA.data[0].y, figA.data[0].x))
    # Layer 0: attention + MLP to lang (norms stay task); middle: attention only (4 of 9 kinds).
    assert lang_x[0] == pytest.approx(7 / 9) and lang_x[4] == pytest.approx(4 / 9)


def test_layer_stack_reads_blend_weights_from_the_plans_sources(tiny_arch):
    """A mixed layer and a mixed non-layer bar show the blends' real weights (3 : 1 here), read
    from the plan's ``Source``s, not 0.5 each."""
    from layerswap_core.merge.registry import Source

    names, arch = tiny_arch
    plan = build_plan(MergeConfig(bottom=2, top=1, transition_bottom=1, w_task=3.0, w_lang=1.0),
                      names, arch)
    blend = Source("linear", ("task", "lang"), (3.0, 1.0))
    for n in names:   # layer 4: attention blended 3:1, the rest from the task expert
        info = arch.classify(n)
        if info.layer == 4:
            plan.sources[n] = blend if info.kind.startswith("attn") else Source.copy("task")
    norm = [n for n in names if arch.classify(n).kind == "final_norm"]
    for n in norm:     # the final norm from the language expert, the embeddings blended 3:1
        plan.sources[n] = Source.copy("lang")
    rows = plan.layer_rows()
    assert rows[4].label == "mixed" and blend in rows[4].sources["attn_q"]
    kinds = list(rows[4].sources)
    n_attn = sum(k.startswith("attn") for k in kinds)
    fig = plots.layer_stack_figure(rows, non_layer=plan.non_layer_sources())
    by_name = {tr.name: tr for tr in fig.data}
    lang = dict(zip(by_name["language expert"].y, by_name["language expert"].x))
    task = dict(zip(by_name["task expert"].y, by_name["task expert"].x))
    assert lang[4] == pytest.approx(0.25 * n_attn / len(kinds))
    assert task[4] == pytest.approx(1 - 0.25 * n_attn / len(kinds))
    assert lang[2] == pytest.approx(0.25) and task[2] == pytest.approx(0.75)   # the transition
    others = len(plan.non_layer_sources()) - len(norm)
    assert norm and others   # a mixed non-layer bar: one tensor per source
    assert lang[-1] == pytest.approx((len(norm) + 0.25 * others) / (len(norm) + others))


def test_profile_figure(stats):
    task, lang = stats
    s = suggest_config(task, lang, 8)
    fig = plots.layer_profile_figure([task, lang], suggestion=s)
    assert [tr.name for tr in fig.data] == ["task", "lang"]
    np.testing.assert_allclose(fig.data[0].y, task.layer_profile() / task.layer_profile().sum())
    assert len(fig.layout.shapes) == 2  # bottom and top swap zones
    raw = plots.layer_profile_figure({"a": task}, normalize=False)
    np.testing.assert_allclose(raw.data[0].y, task.layer_profile())


def test_accuracy_bars_error_bars():
    summary = [{"model": "task expert", "accuracy": 0.3, "ci_low": 0.2, "ci_high": 0.45, "n": 50},
               {"model": "merged", "accuracy": 0.5, "ci_low": 0.36, "ci_high": 0.64, "n": 50}]
    fig = plots.accuracy_bars(summary)
    tr = fig.data[0]
    assert list(tr.x) == ["task expert", "merged"]
    assert list(tr.marker.color) == [plots.COLORS["task"], plots.COLORS["blend"]]
    np.testing.assert_allclose(tr.error_y.array, [0.15, 0.14])
    np.testing.assert_allclose(tr.error_y.arrayminus, [0.1, 0.14])
    assert fig.layout.yaxis.range[1] >= 0.64 and "95%" in tr.hovertemplate


def test_sweep_heatmap_stars_the_best_cell():
    scores = [[0.1, 0.2, None], [0.4, 0.3, 0.2]]
    fig = plots.sweep_heatmap([0, 1, 2], [3, 4], scores, "top u", "bottom b")
    z = np.array(fig.data[0].z, dtype=float)
    assert z.shape == (2, 3) and np.isnan(z[0, 2])
    assert fig.layout.xaxis.title.text == "top u" and fig.layout.yaxis.title.text == "bottom b"
    assert fig.data[0].text[0][2] == "" and fig.data[0].text[1][0] == "★ 40.0%"
    assert fig.data[0].text[1][1] == "30.0%"
    (box,) = fig.layout.shapes  # outline around (b=4, u=0)
    assert (box.x0, box.x1, box.y0, box.y1) == (-0.5, 0.5, 0.5, 1.5)


def test_thirty_layer_heatmap_is_tall_enough():
    st = synthetic_stats(30, "x", {0, 1, 29})
    fig = plots.delta_heatmap(st)
    assert fig.layout.height >= 20 * 30
    z = np.array(fig.data[0].z, dtype=float)
    assert z.shape == (30, 4)
    assert set(np.nonzero(z[:, :3] > 0.5)[0]) == {0, 1, 29}


# --------------------------------------------------------------------------- paper-style options
def test_side_by_side_with_one_threshold_per_expert(stats):
    task, lang = stats
    # the two thresholds show different cells (else this test could not tell them apart)
    assert not np.array_equal(np.nan_to_num(lang.grid("frac_rows_above", 0.001)[2]),
                              np.nan_to_num(lang.grid("frac_rows_above", 0.005)[2]))
    fig = plots.side_by_side_heatmaps(task, lang, tau=(0.005, 0.001))
    for tr, st, t in zip(fig.data, (task, lang), (0.005, 0.001)):
        np.testing.assert_array_equal(np.array(tr.z, dtype=float), st.grid("frac_rows_above", t,
                                                                           plots._union_kinds(task, lang))[2])
        assert f"MAV > {t:.3g}" in tr.hovertemplate
    # each panel names its own threshold; the two thresholds differ, so the main title names none
    assert [a.text for a in fig.layout.annotations] == ["task (τ = 0.005)", "lang (τ = 0.001)"]
    assert "τ =" not in fig.layout.title.text
    # the paper's thresholds print as written
    paper = plots.side_by_side_heatmaps(task, lang, tau=(1.9e-5, 1.0e-5))
    assert [a.text for a in paper.layout.annotations] == ["task (τ = 1.9e-05)", "lang (τ = 1e-05)"]
    # one threshold still means both panels at it (and None in a pair: that expert's default)
    one = plots.side_by_side_heatmaps(task, lang, tau=0.005)
    assert [a.text for a in one.layout.annotations] == ["task (τ = 0.005)", "lang (τ = 0.005)"]
    assert "(τ = 0.005)" in one.layout.title.text
    half = plots.side_by_side_heatmaps(task, lang, tau=(None, 0.001))
    assert half.layout.annotations[0].text == f"task (τ = {task.tau():.3g})"
    with pytest.raises(ValueError, match="one per expert"):
        plots.side_by_side_heatmaps(task, lang, tau=(1e-3, 1e-3, 1e-3))


def test_overlap_uses_each_experts_threshold(stats):
    task, lang = stats
    fig = plots.overlap_heatmap(task, lang, tau=(0.005, 0.001))
    _, _, ft = task.grid("frac_rows_above", 0.005)
    _, _, fl = lang.grid("frac_rows_above", 0.001)
    np.testing.assert_array_equal(np.array(fig.data[0].z, dtype=float), np.fmin(ft, fl))
    assert "0.005 for task, 0.001 for lang" in fig.layout.title.text


def test_only_the_seven_matrices_the_paper_plots(stats):
    task, lang = stats
    seven = ["attn q", "attn k", "attn v", "attn o", "mlp gate", "mlp up", "mlp down"]
    assert [plots.KIND_LABELS[k] for k in task.kinds()] != seven     # norms are there too
    fig = plots.side_by_side_heatmaps(task, lang, tau=(0.005, 0.001), matrices_only=True)
    for tr, st, t in zip(fig.data, (task, lang), (0.005, 0.001)):
        assert list(tr.x) == seven
        kinds = [k for k in st.kinds() if k in plots.MATRIX_KINDS]
        np.testing.assert_array_equal(np.array(tr.z, dtype=float),
                                      st.grid("frac_rows_above", t, kinds)[2])
    assert list(plots.delta_heatmap(task, matrices_only=True).data[0].x) == seven
    assert list(plots.overlap_heatmap(task, lang, matrices_only=True).data[0].x) == seven
    # a family with fused projections keeps them (qkv, gate+up)
    assert {"attn_qkv", "mlp_gate_up"} <= set(plots.MATRIX_KINDS)
    assert not {"norm_qk", "norm_attn", "norm_mlp"} & set(plots.MATRIX_KINDS)


def test_sweep_heatmap_of_an_nll_stars_the_lowest_with_its_own_sign():
    """gold NLL is shown as the table shows it (positive), the lowest starred and brightest."""
    from layerswap_core.workbench import figures as plots

    fig = plots.sweep_heatmap([0, 1], [2, 3], [[1.5, 1.2], [None, 1.9]], "top u", "bottom b",
                              score_label="gold NLL (lower is better)", fmt=".3f",
                              lower_is_better=True)
    text = fig.data[0].text
    assert text[0][1] == "★ 1.200" and "★" not in text[0][0] + text[1][1]
    assert fig.data[0].z[0][1] > 0                      # not negated
    assert fig.data[0].colorscale[0][1] != plots.sweep_heatmap([0], [0], [[1.0]]).data[0].colorscale[0][1]


def test_a_log_colourbar_within_one_decade_has_several_ticks():
    """The MAV colourbar of a range inside one decade showed a single tick; now 1x, 2x and 5x
    the powers of ten inside the range, each placed at its value."""
    import math

    ticks = plots._log_ticks(math.log10(3e-4), math.log10(3e-3))
    assert [t for _, t in ticks] == ["5e-4", "1e-3", "2e-3"]
    assert all(abs(v - math.log10(float(t))) < 1e-12 for v, t in ticks)
    wide = plots._log_ticks(-6.2, -1.5)
    assert [t for _, t in wide] == ["1e-6", "1e-5", "1e-4", "1e-3", "1e-2"]
