"""Merge plans are pure data: every check here runs on parameter names only (no tensors)."""
from __future__ import annotations

import pytest

from layerswap_core.checkpoints.architectures import get_architecture
from layerswap_core.merge.config import MergeConfig, validated_ranges
from layerswap_core.merge.errors import ConfigError
from layerswap_core.merge.partition import Partition, parse_layers, scale_layers
from layerswap_core.merge.plan import build_plan
from layerswap_core.merge.registry import Source

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


@pytest.mark.parametrize("non_layer", ["blend", "task", "lang"])
@pytest.mark.parametrize("L,b,u,tb,tu", [(32, 5, 2, 0, 0), (32, 5, 2, 2, 3), (8, 2, 1, 1, 2),
                                         (8, 0, 0, 0, 0), (8, 4, 4, 0, 0), (8, 0, 0, 4, 4)])
def test_algorithm_1_every_parameter(L, b, u, tb, tu, non_layer):
    names, arch = llama(L)
    cfg = MergeConfig(bottom=b, top=u, transition_bottom=tb, transition_top=tu, w_task=0.3,
                      w_lang=0.7, non_layer=non_layer)
    plan = build_plan(cfg, names, arch)
    assert list(plan.sources) == names
    for n in names:
        layer, _ = split(n)
        if layer is None:  # embeddings, final norm, LM head: Algorithm 1's averaging branch
            expect = Source("linear", ("task", "lang"), (0.3, 0.7)) if non_layer == "blend" \
                else Source.copy(non_layer)
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
    (dict(w_lang=-1.0), "w_lang: must be a number from 0 to 10000"),
    (dict(w_task=float("nan")), "w_task: must be a number from 0 to 10000"),
    (dict(w_task=1e39), "w_task: must be a number from 0 to 10000"),
    (dict(lambda_task=float("nan")), "lambda_task: must be a number from -100 to 100, got nan"),
    (dict(lambda_lang=float("-inf")), "lambda_lang: must be a number from -100 to 100, got -inf"),
    (dict(ties_lambda=float("inf")), "ties_lambda: must be a number from -100 to 100, got inf"),
    (dict(ties_density=float("nan")), "ties_density: must be a number in (0, 1]"),
    (dict(ties_density=1.5), "ties_density: must be a number in (0, 1]"),
    (dict(ties_density="0.5"), "ties_density: must be a number in (0, 1] (the fraction of each "
                               "delta kept), got '0.5' (text)"),
    (dict(transition_bottom=None), "transition_bottom: must be a non-negative integer, got null"),
    (dict(magnitude_weights="yes"), "magnitude_weights: must be true or false"),
    (dict(non_layer="base"), "non_layer: unknown 'base'; choose one of blend, task, lang"),
    (dict(scale_partition=1), "scale_partition: must be true or false, got 1 (int)"),
    (dict(partition=5), "partition: must be a preset name (A, B, C) or a list of rules, got 5"),
    (dict(partition=["0-3"]), "partition rule 1: expected a mapping"),
    (dict(task=5), "task: must be a model reference"),
    (dict(partition="B"), "partition preset B: first 8 + last 4 layers as published"),
    (dict(partition="C"), "leave no middle layer to the task expert in a model of 8 layers"),
    (dict(partition=[{"layers": "0-20000000", "kinds": "mlp"}]),
     "partition rule 1: layer selection '0-20000000' is outside the model's layers 0..7"),
    (dict(partition=[{"layers": "first 9"}]), "asks for more layers than the model's 8"),
    (dict(partition=[{"layers": [1, None]}]), "null (no value) is not a layer number"),
    (dict(partition=[{"layers": "1", "kinds": 3}]), "module kinds: 3 (int) is not a kind name"),
    (dict(method="average"), "method: unknown 'average'"),
    (dict(dtype="int8"), "dtype: unknown 'int8'"),
    (dict(ties_density=0.0), "ties_density"),
    (dict(partition="D"), "unknown partition preset 'D'"),
    (dict(partition=[{"layers": "0-9"}]), "'0-9' is outside the model's layers 0..7"),
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


@pytest.mark.parametrize("L", [32, 36])
def test_partition_presets_select_the_published_absolute_layers(L):
    """The follow-up paper's presets on its 32- and 36-layer models: the counts as given."""
    names, arch = llama(L)
    first6_last2 = set(range(6)) | {L - 2, L - 1}
    a = Partition.preset("A", L)
    expect_a = {n for n in names if split(n)[0] is not None and
                (split(n)[1] in ATTN or (split(n)[1] in MLP and split(n)[0] in first6_last2))}
    assert _lang_set(a, names, arch) == expect_a
    b = Partition.preset("B", L)
    assert _lang_set(b, names, arch) == \
        {n for n in names if split(n)[0] in set(range(8)) | set(range(L - 4, L))}
    c = Partition.preset("C", L)
    assert _lang_set(c, names, arch) == {n for n in names if split(n)[0] in first6_last2}
    assert c.goes_to_lang(f"model.layers.{L - 1}.mlp.up_proj.weight", arch)
    assert not c.goes_to_lang("model.embed_tokens.weight", arch)
    assert not c.goes_to_lang("lm_head.weight", arch)
    assert "as published" in c.describe()
    # through a config: the non-layer parameters follow non_layer (blend by default)
    plan = build_plan(MergeConfig(partition="b"), names, arch)
    assert {n for n, s in plan.sources.items() if s.model == "lang"} == _lang_set(b, names, arch)
    assert plan.sources["lm_head.weight"] == Source("linear", ("task", "lang"), (1.0, 1.0))
    assert "partition B (as published)" in plan.summary_text()


@pytest.mark.parametrize("L,preset,msg", [
    (8, "A", "first 6 + last 2 layers as published"), (12, "B", "first 8 + last 4 layers"),
    (8, "C", "no middle layer"), (4, "B", "in a model of 4 layers")])
def test_partition_presets_refuse_models_they_do_not_fit(L, preset, msg):
    names, arch = llama(L)
    with pytest.raises(ConfigError, match="scale_partition") as e:
        build_plan(MergeConfig(partition=preset), names, arch)
    assert msg in str(e.value) and f"partition preset {preset}" in str(e.value)
    Partition.preset(preset, 13 if preset == "B" else 9)  # one more middle layer: fits


def test_partition_presets_scale_with_depth_only_when_asked():
    names, arch = llama(16)
    with pytest.raises(ConfigError, match="as published"):
        Partition.preset("B", 12)
    # 32-layer "first 8, last 4" -> 16 layers: first 4, last 2 (the tool's rule)
    scaled_b = Partition.preset("b", 16, scale=True)
    assert _lang_set(scaled_b, names, arch) == \
        {n for n in names if split(n)[0] in {0, 1, 2, 3, 14, 15}}
    assert "scaled" in scaled_b.describe() and "tool's own rule" in scaled_b.describe()
    # "first 6, last 2" -> first 3, last 1
    plan = build_plan(MergeConfig(partition="C", scale_partition=True), names, arch)
    assert {n for n, s in plan.sources.items() if s.model == "lang"} == \
        {n for n in names if split(n)[0] in {0, 1, 2, 15}}
    # the published counts are not scaled on 36 layers unless asked (B would be 9 + 5)
    names36, arch36 = llama(36)
    assert _lang_set(Partition.preset("B", 36, scale=True), names36, arch36) == \
        {n for n in names36 if split(n)[0] in set(range(9)) | set(range(31, 36))}
    with pytest.raises(ConfigError, match="scaled to first 1 \\+ last 1 leave no middle layer"):
        Partition.preset("A", 2, scale=True)


def test_validated_ranges_as_published_and_scaled():
    r = validated_ranges(32)
    assert (r.bottom, r.top, r.transition, r.published) == ((3, 4, 5), (0, 1, 2), (0, 1, 2), True)
    assert "validated in the layer-swapping paper" in r.note
    r16 = validated_ranges(16)
    assert (r16.bottom, r16.top, r16.transition, r16.published) == ((2, 3), (0, 1), (0, 1), False)
    assert "tool's own rule" in r16.note and "16 layers" in r16.note
    assert validated_ranges(64).bottom == (6, 8, 10)


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
    assert "non-layer parameters (embeddings, final norm, LM head): averaged as in Algorithm 1 " \
        "(non_layer: blend); the LM head is tied to the embeddings" in text
    assert "non-layer blend 0.50/0.50: model.embed_tokens, model.norm" in text
    task_plan = build_plan(MergeConfig(bottom=2, top=1, non_layer="task"), names, arch)
    task_text = task_plan.summary_text()
    assert "from the task expert (non_layer: task)" in task_text
    assert "non-layer task: model.embed_tokens, model.norm" in task_text
    cells = plan.cells()
    assert cells[(2, "mlp_down")] == "blend" and cells[(7, "attn_v")] == "lang"
    assert len(cells) == 8 * len(LAYER_SUFFIXES)
    other = build_plan(MergeConfig(bottom=3, top=1, transition_bottom=1), names, arch)
    changed = set(other.changed_names(plan))
    assert changed == {n for n in names if split(n)[0] in (2, 3)}
    assert plan.changed_names(plan) == [] and plan.changed_names(None) == names
    mixed = build_plan(MergeConfig(partition="A", scale_partition=True), names, arch).layer_rows()
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


def test_yaml_aliases_are_sized_before_anything_is_built():
    """Anchors a person writes still load (each alias sized once: a graph, not a tree); an alias
    bomb, an alias inside itself and nesting deeper than the stack are one-line refusals."""
    from layerswap_core.merge.config import MAX_YAML_EXPANSION, load_yaml

    text = "w: &w {w_task: 0.5, w_lang: 0.5}\nsoup:\n  <<: *w\nrules: [&r [1, 2], *r, *r]\n"
    assert load_yaml(text) == {"w": {"w_task": 0.5, "w_lang": 0.5},
                               "soup": {"w_task": 0.5, "w_lang": 0.5}, "rules": [[1, 2]] * 3}
    long = "x: [" + ", ".join(["word"] * 300_000) + "]"      # long but no alias: its text passes
    assert len(load_yaml(long)["x"]) == 300_000
    lines = ["a0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 7)]
    with pytest.raises(ConfigError, match=f"more than {MAX_YAML_EXPANSION:,} nodes") as e:
        load_yaml("\n".join(lines), "config")     # 9^7 strings: 4.8 million
    assert str(e.value).startswith("config: its aliases")
    assert load_yaml("\n".join(lines[:5]))["a4"][0][0][0][0] == ["lol"] * 9   # 9^5: 59,049
    with pytest.raises(ConfigError, match="inside its own anchor"):
        load_yaml("a: &a [1, *a]")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_yaml("[" * 5000 + "]" * 5000)


def test_rules_address_the_non_layer_parameters():
    names, arch = llama(8)
    glob = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    blend = Source("linear", ("task", "lang"), (1.0, 1.0))
    # no rule names them: they follow non_layer (default blend, or the chosen expert)
    plan = build_plan(MergeConfig(partition=[{"layers": "0-1"}]), names, arch)
    assert [plan.sources[n] for n in glob] == [blend] * 3
    plan = build_plan(MergeConfig(partition=[{"layers": "0-1"}], non_layer="lang"), names, arch)
    assert [plan.sources[n].model for n in glob] == ["lang"] * 3
    # "non-layer" in a layer selection: all of them, or some kinds of them
    rules = [{"layers": "0-1, non-layer"}, {"layers": "non-layer", "kinds": "final_norm",
                                              "to": "task"}]
    plan = build_plan(MergeConfig(partition=rules), names, arch)
    assert [plan.sources[n].model for n in glob] == ["lang", "task", "lang"]
    assert {n for n, s in plan.sources.items() if s.model == "lang"} == \
        {n for n in names if split(n)[0] in (0, 1)} | {glob[0], glob[2]}
    # kinds alone reach them too; explicit layers without "non-layer" do not
    plan = build_plan(MergeConfig(partition=[{"kinds": "lm_head"}, {"layers": "all"}],
                                  non_layer="task"), names, arch)
    assert [plan.sources[n].model for n in glob] == ["task", "task", "lang"]
    with pytest.raises(ConfigError, match="'non-layer' is not a layer number"):
        parse_layers("non-layer", 8)


def test_tied_head_stays_with_the_embeddings():
    names, arch = llama(8, tied=True)
    for kinds in ("lm_head", "lm_head, final_norm"):  # would silently do nothing
        with pytest.raises(ConfigError, match="ties its LM head to the embeddings"):
            build_plan(MergeConfig(partition=[{"layers": "non-layer", "kinds": kinds}]), names,
                       arch)
    for kinds in ("embed", "embed, lm_head"):  # the one tensor (embeddings = head) moves
        plan = build_plan(MergeConfig(partition=[{"layers": "non-layer", "kinds": kinds}]),
                          names, arch)
        assert plan.sources["model.embed_tokens.weight"].model == "lang"
        assert plan.sources["model.norm.weight"].method == "linear"
        assert "the LM head is tied to the embeddings" in plan.summary_text()
    untied, arch_u = llama(8)
    plan = build_plan(MergeConfig(partition=[{"kinds": "lm_head"}]), untied, arch_u)
    assert plan.sources["lm_head.weight"].model == "lang"
    assert plan.sources["model.embed_tokens.weight"].method == "linear"
    assert "tied" not in plan.summary_text()


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_huge_layer_ranges_are_refused_before_anything_is_built():
    import time
    import tracemalloc
    names, arch = llama(8)
    tracemalloc.start()
    t0 = time.perf_counter()
    for spec in ("0-20000000", "0-200000000000000000000", "19999999-20000000", "3, 5-99999999999",
                 [0, 10 ** 12], "first 20000000", "last 99999999"):
        with pytest.raises(ConfigError, match="0..7") as e:
            build_plan(MergeConfig(partition=[{"layers": spec, "kinds": "mlp"}]), names, arch)
        assert "8" in str(e.value)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1_000_000 and time.perf_counter() - t0 < 1.0
    # input caps: characters, items, rules
    with pytest.raises(ConfigError, match="more than the 1000 allowed"):
        parse_layers("1," * 600, 8)
    with pytest.raises(ConfigError, match="300 items, more than the 256 allowed"):
        parse_layers([1] * 300, 8)
    with pytest.raises(ConfigError, match="300 rules, more than the 256 allowed"):
        build_plan(MergeConfig(partition=[{"layers": "1"}] * 300), names, arch)
    assert parse_layers("0-2, 7, last 1", 8) == {0, 1, 2, 7}


@pytest.mark.parametrize("text,msg", [
    ("transition_bottom: null", "transition_bottom: must be a non-negative integer, got null"),
    ('ties_density: "0.5"', "ties_density: must be a number in (0, 1]"),
    ("partition: 5", "partition: must be a preset name (A, B, C) or a list of rules, got 5"),
    ("partition: [[1, 2]]", "partition rule 1: expected a mapping"),
    ("w_lang: .inf", "w_lang: must be a number from 0 to 10000"),
    ("lambda_task: .nan", "lambda_task: must be a number from -100 to 100, got nan"),
    ("lambda_lang: 1e39", "lambda_lang: must be a number from -100 to 100, got 1e+39"),
    ("ties_lambda: -1.0e+39", "ties_lambda: must be a number from -100 to 100, got -1e+39"),
    ("non_layer: both", "non_layer: unknown 'both'"),
    ("bottom: [1]", "bottom: must be a non-negative integer, got [1] (list)"),
    ("dtype: 16", "dtype: unknown 16 (int)"),
    ("nonlayer: task", "unknown merge config key(s): nonlayer"),
    ("- method: soup", "a merge config must be a mapping, got [{'method': 'soup'}] (list)"),
])
def test_yaml_type_errors_are_one_line_naming_the_field(tmp_path, text, msg):
    p = tmp_path / "m.yaml"
    p.write_text(text + "\n")
    with pytest.raises(ConfigError) as e:
        MergeConfig.load(p)
    assert msg in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith(str(p))


def test_yaml_new_fields_and_files_of_earlier_versions():
    cfg = MergeConfig(non_layer="lang", partition="B", scale_partition=True, ties_density=1e-3)
    assert MergeConfig.from_yaml(cfg.to_yaml()) == cfg
    assert MergeConfig.from_yaml("ties_density: 1e-3\n").ties_density == 1e-3  # YAML 1.2 float
    assert MergeConfig.from_yaml("method: soup\n").non_layer == "blend"
    # written by a layerswap without these keys: keep that version's behaviour
    old = MergeConfig.from_yaml("bottom: 2\ntop: 1\npartition: C\nlayerswap_version: 0.1.0\n")
    assert (old.non_layer, old.scale_partition) == ("task", True)
