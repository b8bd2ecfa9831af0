"""Merge plans are pure data: every check here runs on parameter names only (no tensors)."""
from __future__ import annotations

import pytest

from layerswap_core.architectures import get_architecture
from layerswap_core.plan import (ConfigError, MergeConfig, Partition, Source, build_plan,
                                 scale_layers)

LAYER_SUFFIXES = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                  "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                  "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight")
ATTN = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.o_proj.weight"}
MLP = {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}


def llama(L: int, tied: bool = False):
    names = ["model.embed_tokens.weight"]
    names += [f"model.layers.{l}.{s}" for l in range(L) for s in LAYER_SUFFIXES]
    names += ["model.norm.weight"] + ([] if tied else ["lm_head.weight"])
    return names, get_architecture({"model_type": "llama", "num_hidden_layers": L})


def split(name: str):
    """(layer, suffix) of a name, written independently of the architecture table."""
    if name.startswith("model.layers."):
        rest = name[len("model.layers."):]
        l, suffix = rest.split(".", 1)
        return int(l), suffix
    return None, name


@pytest.mark.parametrize("L,b,u,tb,tu", [(32, 5, 2, 0, 0), (32, 5, 2, 2, 3), (8, 2, 1, 1, 2),
                                         (8, 0, 0, 0, 0), (8, 4, 4, 0, 0), (8, 0, 0, 4, 4)])
def test_algorithm_1_every_parameter(L, b, u, tb, tu):
    names, arch = llama(L)
    cfg = MergeConfig(bottom=b, top=u, transition_bottom=tb, transition_top=tu, w_task=0.3, w_lang=0.7)
    plan = build_plan(cfg, names, arch)
    assert list(plan.sources) == names
    for n in names:
        layer, _ = split(n)
        if layer is None:
            expect = Source.copy("task")
        elif layer < b:
            expect = Source.copy("lang")
        elif layer < b + tb:
            expect = Source("linear", ("task", "lang"), (0.3, 0.7))
        elif layer < L - u - tu:
            expect = Source.copy("task")
        elif layer < L - u:
            expect = Source("linear", ("task", "lang"), (0.3, 0.7))
        else:
            expect = Source.copy("lang")
        assert plan.sources[n] == expect, n


def test_defaults_scale_from_32_layers():
    assert MergeConfig.default_for(32).layer_counts(32) == (5, 2, 0, 0)
    assert (MergeConfig.default_for(64).bottom, MergeConfig.default_for(64).top) == (10, 4)
    assert (MergeConfig.default_for(30).bottom, MergeConfig.default_for(30).top) == (5, 2)
    for L in range(1, 80):
        b, u, _, _ = MergeConfig().layer_counts(L)
        assert 0 <= b + u <= L and u >= 1
    assert scale_layers(0, 30) == 0


@pytest.mark.parametrize("kw,msg", [
    (dict(bottom=5, top=2, transition_bottom=1, transition_top=1), "exceeds the model's 8 layers"),
    (dict(bottom=-1), "bottom: must be a non-negative integer"),
    (dict(top=1.5), "top: must be a non-negative integer"),
    (dict(transition_bottom=1, w_task=0.0, w_lang=0.0), "w_task + w_lang is 0"),
    (dict(method="soup", w_task=0.0, w_lang=0.0), "w_task + w_lang is 0"),
    (dict(w_lang=-1.0), "w_lang: must be a non-negative number"),
    (dict(method="average"), "method: unknown 'average'"),
    (dict(dtype="int8"), "dtype: unknown 'int8'"),
    (dict(ties_density=0.0), "ties_density"),
    (dict(partition="D"), "unknown partition preset 'D'"),
    (dict(partition=[{"layers": "0-9"}]), "names layer 8"),
    (dict(partition=[{"layers": "0-3", "kinds": "ffn"}]), "unknown module kind 'ffn'"),
    (dict(partition=[{"layer": "0-3"}]), "unknown key(s) ['layer']"),
])
def test_invalid_configs_are_rejected_with_the_field_named(kw, msg):
    names, arch = llama(8)
    with pytest.raises(ConfigError) as e:
        build_plan(MergeConfig(**kw), names, arch)
    assert msg in str(e.value)


def test_methods_that_need_the_base_say_so():
    for cfg in (MergeConfig(method="ties"), MergeConfig(method="task_arithmetic"),
                MergeConfig(method="soup", magnitude_weights=True)):
        with pytest.raises(ConfigError, match="base"):
            cfg.validate(8, has_base=False)
    MergeConfig(method="soup").validate(8, has_base=False)  # plain soup does not


def _lang_set(partition: Partition, names, arch):
    return set(partition.parameter_names(names, arch))


def test_partition_presets_at_32_layers():
    names, arch = llama(32)
    first6_last2 = set(range(6)) | {30, 31}
    a = Partition.preset("A", 32)
    expect_a = {n for n in names if split(n)[0] is not None and
                (split(n)[1] in ATTN or (split(n)[1] in MLP and split(n)[0] in first6_last2))}
    assert _lang_set(a, names, arch) == expect_a
    b = Partition.preset("B", 32)
    assert _lang_set(b, names, arch) == {n for n in names if split(n)[0] in set(range(8)) | {28, 29, 30, 31}}
    c = Partition.preset("C", 32)
    assert _lang_set(c, names, arch) == {n for n in names if split(n)[0] in first6_last2}
    assert c.goes_to_lang("model.layers.31.mlp.up_proj.weight", arch)
    assert not c.goes_to_lang("model.embed_tokens.weight", arch)
    assert not c.goes_to_lang("lm_head.weight", arch)


def test_partition_presets_scale_with_depth():
    names, arch = llama(16)
    # 32-layer "first 8, last 4" -> 16 layers: first 4, last 2
    assert _lang_set(Partition.preset("b", 16), names, arch) == \
        {n for n in names if split(n)[0] in {0, 1, 2, 3, 14, 15}}
    # "first 6, last 2" -> first 3, last 1
    assert _lang_set(Partition.preset("C", 16), names, arch) == \
        {n for n in names if split(n)[0] in {0, 1, 2, 15}}


def test_custom_partition_rules_later_rules_win():
    names, arch = llama(8)
    p = Partition.from_rules([{"layers": "0-2, 7", "kinds": "attention,norm"},
                              {"layers": [1], "kinds": "norm_attn", "to": "task"},
                              {"kinds": "embed"}], 8)
    got = _lang_set(p, names, arch)
    norms = {"input_layernorm.weight", "post_attention_layernorm.weight"}
    expect = {n for n in names if split(n)[0] in {0, 1, 2, 7} and split(n)[1] in ATTN | norms}
    expect.discard("model.layers.1.input_layernorm.weight")
    expect.add("model.embed_tokens.weight")
    assert got == expect
    plan = build_plan(MergeConfig(partition=[{"layers": "first 2", "kinds": "mlp"}]), names, arch)
    assert {n for n, s in plan.sources.items() if s.model == "lang"} == \
        {n for n in names if split(n)[0] in {0, 1} and split(n)[1] in MLP}
    assert plan.cells()[(0, "mlp_up")] == "lang" and plan.cells()[(0, "attn_q")] == "task"


def test_baseline_plans():
    names, arch = llama(4)
    soup = build_plan(MergeConfig(method="soup"), names, arch)
    assert set(soup.sources.values()) == {Source("linear", ("task", "lang"), (1.0, 1.0))}
    ta = build_plan(MergeConfig(method="task_arithmetic", lambda_task=0.5, lambda_lang=0.8), names, arch)
    assert set(ta.sources.values()) == {Source("task_arithmetic", ("base", "task", "lang"), (0.5, 0.8))}
    assert ta.needs == {"base", "task", "lang"}
    ties = build_plan(MergeConfig(method="ties", ties_density=0.3), names, arch)
    (src,) = set(ties.sources.values())
    assert src.method == "ties" and src.kwargs() == {"density": 0.3, "lam": 1.0}
    mag = build_plan(MergeConfig(method="magnitude_soup"), names, arch)
    assert not mag.resolved and "magnitude" in mag.summary_text()
    resolved = mag.with_magnitude((2.0, 6.0))
    assert resolved.resolved and set(resolved.sources.values()) == {Source("linear", ("task", "lang"), (2.0, 6.0))}
    assert "task 0.250, lang 0.750" in resolved.summary_text()


def test_summary_rows_cells_and_changed_names():
    names, arch = llama(8, tied=True)
    plan = build_plan(MergeConfig(bottom=2, top=1, transition_bottom=1), names, arch)
    rows = plan.layer_rows()
    assert [r.label for r in rows] == ["lang", "lang", "blend 0.50/0.50", "task", "task", "task",
                                       "task", "lang"]
    text = plan.summary_text()
    assert "0-1       lang" in text and "3-6       task" in text and "7         lang" in text
    assert "model.embed_tokens" in text
    cells = plan.cells()
    assert cells[(2, "mlp_down")] == "blend" and cells[(7, "attn_v")] == "lang"
    assert len(cells) == 8 * len(LAYER_SUFFIXES)
    other = build_plan(MergeConfig(bottom=3, top=1, transition_bottom=1), names, arch)
    changed = set(other.changed_names(plan))
    assert changed == {n for n in names if split(n)[0] in (2, 3)}
    assert plan.changed_names(plan) == [] and plan.changed_names(None) == names
    mixed = build_plan(MergeConfig(partition="A"), names, arch).layer_rows()
    assert mixed[3].label == "mixed" and "lang: attention" in mixed[3].text()


def test_yaml_round_trip_and_unknown_keys(tmp_path):
    cfg = MergeConfig(method="layer_swap", bottom=3, top=1, transition_bottom=1, w_task=0.25,
                      w_lang=0.75, partition=None, dtype="bfloat16", task="embedded:x", lang="/a/b")
    assert MergeConfig.from_yaml(cfg.to_yaml()) == cfg
    rules = MergeConfig(partition=[{"layers": "0-3", "kinds": "mlp"}, {"layers": "last 1"}])
    assert MergeConfig.from_yaml(rules.to_yaml()) == rules
    assert MergeConfig.from_dict(cfg.to_dict()) == cfg
    p = tmp_path / "m.yaml"
    p.write_text("method: soup\nw_task: 2\nbotom: 3\n")
    with pytest.raises(ConfigError, match="botom"):
        MergeConfig.load(p)
    p.write_text("method: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        MergeConfig.load(p)
