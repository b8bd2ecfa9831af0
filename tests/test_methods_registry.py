"""The merge-method registry: each method registered once, read by the config checks, the plan,
the CLI, the workbench and the LoRA path; MergeConfig's fields declared by the knobs."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.cli import build_parser, main
from layerswap_core.cli.merge import config_from_args
from layerswap_core.merge import mergekit_parts, methods, registry
from layerswap_core.merge.config import FIELDS, MergeConfig
from layerswap_core.merge.errors import ConfigError
from layerswap_core.merge.executor import merge_to_folder
from layerswap_core.merge.mergekit_yaml import from_mergekit, to_mergekit
from layerswap_core.merge.plan import build_plan
from layerswap_core.merge.registry import MergeMethod, Source
from layerswap_core.workbench import configure as wb_configure

from test_plan import llama


def _merge_parser_choices(dest: str) -> list:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["merge"]
    return list(next(a for a in sub._actions if a.dest == dest).choices)


@pytest.fixture
def lang_only():
    """A throw-away method, registered here and nowhere else: every tensor from the language
    expert, blend weights as knobs (it reads existing knobs only)."""
    method = registry.register_method(MergeMethod(
        "lang_only", "language only", ("w_lang",),
        lambda config, names, arch, blend: dict.fromkeys(names, Source.copy("lang")),
        lambda config, num_layers: f"language expert only (w_lang {config.w_lang:g})",
        linear=True))
    try:
        yield method
    finally:
        registry.unregister_method("lang_only")


def test_a_method_registered_in_one_place_reaches_plan_cli_workbench_and_lora(lang_only):
    names, arch = llama(4)
    plan = build_plan(MergeConfig(method="lang_only", w_lang=2.0), names, arch)
    assert set(plan.sources.values()) == {Source.copy("lang")} and list(plan.sources) == names
    assert plan.summary_text().startswith("language expert only (w_lang 2)")
    assert "lang_only" in _merge_parser_choices("method")
    args = build_parser().parse_args(["plan", "--method", "lang_only", "--w-lang", "3"])
    cfg = config_from_args(args)
    assert (cfg.method, cfg.w_lang) == ("lang_only", 3.0)
    assert wb_configure.METHOD_LABELS["language only"] == "lang_only"
    assert "language only" in list(wb_configure.METHOD_LABELS)
    assert "lang_only" in registry.linear_methods()
    assert not cfg.needs_base and not cfg.has_blends


def test_an_unregistered_method_is_gone_everywhere(lang_only):
    registry.unregister_method("lang_only")
    assert "lang_only" not in _merge_parser_choices("method")
    assert "language only" not in list(wb_configure.METHOD_LABELS)
    with pytest.raises(ConfigError, match="method: unknown 'lang_only'; choose one of layer_swap"):
        MergeConfig(method="lang_only").check_fields()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["plan", "--method", "lang_only"])


def test_a_method_must_declare_its_knobs():
    with pytest.raises(ValueError, match="undeclared knob"):
        registry.register_method(MergeMethod("x", "x", ("alpha",), dict, str))
    assert "x" not in registry.MERGE_METHODS


def test_every_knob_is_a_config_field_with_its_default_and_a_cli_flag():
    cfg = MergeConfig()
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["merge"]
    flags = {o for a in sub._actions for o in a.option_strings}
    for method in registry.MERGE_METHODS.values():
        for name in method.knobs:
            knob = FIELDS[name]
            assert getattr(cfg, name) == knob.default
            assert "--" + name.replace("_", "-") in flags
    assert list(cfg.to_dict()) == list(FIELDS)
    assert list(FIELDS)[:1] == ["method"] and list(FIELDS)[-3:] == ["task", "lang", "base"]
    # the CLI flags are typed from the knobs: a text for a number is argparse's error
    with pytest.raises(SystemExit):
        build_parser().parse_args(["plan", "--ties-density", "half"])


def test_base_and_linearity_come_from_the_registry():
    assert set(registry.linear_methods()) == {"layer_swap", "soup", "task_arithmetic"}
    needs = {m.id for m in registry.MERGE_METHODS.values() if m.needs_base}
    assert needs == {"magnitude_soup", "task_arithmetic", "ties"}
    for m in needs:
        assert MergeConfig(method=m).needs_base
    assert not MergeConfig(method="soup").needs_base
    assert MergeConfig(method="soup", magnitude_weights=True).needs_base


@pytest.mark.parametrize("text,msg", [
    ('bottom: "five"', "bottom: must be a non-negative integer, got 'five' (text)"),
    ("bottom: -1", "bottom: must be a non-negative integer, got -1 (int)"),
    ("top: 2.0", "top: must be a non-negative integer, got 2.0 (float)"),
    ("w_task: .inf", "w_task: must be a number from 0 to 10000 (only the ratio w_task : w_lang "
                     "matters), got inf (float)"),
    ("w_lang: true", "w_lang: must be a number from 0 to 10000"),
    ("method: foo", "method: unknown 'foo'; choose one of layer_swap, soup, magnitude_soup, "
                    "task_arithmetic, ties"),
    ('magnitude_weights: "yes"', "magnitude_weights: must be true or false, got 'yes' (text)"),
    ("ties_density: 1.5", "ties_density: must be a number in (0, 1] (the fraction of each delta "
                          "kept), got 1.5 (float)"),
    ("tokenizer_source: both", "tokenizer_source: unknown 'both'; choose one of task, lang, base"),
    ("task: 5", "task: must be a model reference (a folder, owner/name or embedded:NAME), got 5"),
    ("partition: D", "unknown partition preset 'D'; known: A, B, C"),
])
def test_yaml_type_errors_name_the_field_in_one_line(text, msg):
    with pytest.raises(ConfigError) as e:
        MergeConfig.from_yaml(text + "\n")
    assert str(e.value).startswith(msg) and "\n" not in str(e.value)


def test_the_first_refused_field_is_named():
    with pytest.raises(ConfigError, match="^bottom:"):
        MergeConfig(bottom="x", ties_lambda=1e9).check_fields()
    # integers are read as numbers, booleans never
    assert MergeConfig.from_yaml("w_task: 3\n").w_task == 3.0
    MergeConfig(w_task=3, lambda_task=-2).check_fields()


def test_knob_checks_are_strict_and_follow_the_declared_bounds():
    """What each kind accepts (``Knob.refuses``): numpy's numbers count as numbers; a bool or
    text never does, nor does a float for a count. (This is what the pydantic strict model it
    replaced accepted, but for numpy's bool_ as a number: checked once, value by value over
    every field, when it was replaced; docs/performance.md.)"""
    import numpy as np
    k = FIELDS
    for v in (0, 3, 10**9):
        assert not k["bottom"].refuses(v)
    for v in (-1, 3.0, True, "3", np.int64(3)):
        assert k["bottom"].refuses(v), v
    assert not k["bottom"].refuses(None) and k["transition_bottom"].refuses(None)  # optional
    for v in (0, 0.0, 2, 0.5, 1e4, np.float32(0.5), np.int64(3)):
        assert not k["w_task"].refuses(v), v
    for v in (-1e-9, 1e4 + 1, float("nan"), float("inf"), False, "1", None, np.True_, [1]):
        assert k["w_task"].refuses(v), v
    assert k["ties_density"].refuses(0.0) and not k["ties_density"].refuses(1.0)  # (0, 1]
    assert not k["dtype"].refuses(None) and k["dtype"].refuses(b"float32")   # optional choice
    assert k["non_layer"].refuses(None) and not k["non_layer"].refuses("lang")
    assert k["magnitude_weights"].refuses(1) and not k["magnitude_weights"].refuses(False)
    assert not k["partition"].refuses(None)          # a "value" knob: its own check decides
    with pytest.raises(ConfigError, match="^partition: must be a preset name"):
        k["partition"].refuses(5)


# --------------------------------------------------------------------------- the toy method
# Its whole definition, mergekit YAML out and in included, is this block: adding it touched no
# other file (test_a_toy_method_declared_here_merges_round_trips_and_shows_on_the_cli).
def _toy_scale(tensors, weights):
    base, lang = (t.float() for t in tensors)
    return base + float(weights[0]) * (lang - base)


def _toy_to_mergekit(config, plan, paths, notes) -> dict:
    """mergekit's task_arithmetic of the language expert alone: base + alpha * (lang - base)."""
    if config.toy_flag:
        raise ConfigError("mergekit has no toy flag")
    notes.append("toy: mergekit's YAML names no task expert (give --task to layerswap)")
    return dict(merge_method="task_arithmetic", base_model=paths["base"],
                parameters={"normalize": False},
                models=[{"model": paths["lang"], "parameters": {"weight": config.toy_alpha}}])


def _toy_from_mergekit(doc, num_layers):
    """A task_arithmetic of one model (the built-in reads two) is the toy's."""
    models = doc.get("models")
    if doc.get("merge_method") != "task_arithmetic" or not isinstance(models, list) \
            or len(models) != 1:
        return None
    lang = mergekit_parts.model_of(models[0], "models")
    p = mergekit_parts.params(models[0].get("parameters"), doc.get("parameters"))
    if p.get("normalize"):
        mergekit_parts.refuse("toy: normalize has no toy counterpart")
    return dict(method="toy", toy_alpha=mergekit_parts.number(p, "weight", "toy"), lang=lang,
                base=doc.get("base_model"))


def _declare_toy():
    """A method with new knobs (a number box and a checkbox), its own per-tensor arithmetic and
    its mergekit YAML writer and reader, all in one declaration."""
    return registry.merge_method(
        "toy", "toy scale",
        knobs=(registry.Knob("toy_alpha", "number", 0.5, lo=0.0, hi=2.0, step=0.1,
                             label="toy alpha", short="alpha", help="scale of the lang delta"),
               registry.Knob("toy_flag", "bool", False, label="toy flag", help="a flag"),
               "w_task"),
        arithmetic=(methods.tensor_method(
            "toy_scale", _toy_scale, "", "base + alpha * (lang - base)", row_wise=True,
            label=lambda source: f"toy x{source.weights[0]:g}",
            coefficients=lambda source: {"lang": source.weights[0]}),),
        sources=lambda config, names, arch, blend: dict.fromkeys(
            names, Source("toy_scale", ("base", "lang"), (float(config.toy_alpha),))),
        describe=lambda config, num_layers: f"toy: alpha {config.toy_alpha:g}"
                                            f"{' (flag)' if config.toy_flag else ''}",
        needs_base=True, linear=True, to_mergekit=_toy_to_mergekit,
        from_mergekit=_toy_from_mergekit, mergekit_reads="task_arithmetic of one model (toy)")
# --------------------------------------------------------------------------- (end of the toy)


def test_a_toy_method_declared_here_merges_round_trips_and_shows_on_the_cli(tiny, tmp_path,
                                                                           capsys):
    """The toy above, declared in this file alone, through everything a built-in goes through:
    the config's checks, the plan, a disk merge (each tensor the toy's formula), the config's
    YAML and mergekit's YAML both ways, and the CLI (its flags in `layerswap merge --help`, a
    merge and --emit-mergekit from the command line). Unregistered, it is gone again."""
    refs = {r: str(tiny[r]) for r in ("task", "lang", "base")}
    one_model = ("merge_method: task_arithmetic\nbase_model: z\n"
                 "models:\n- {model: b, parameters: {weight: 0.7}}\n")
    with pytest.raises(ConfigError, match="exactly two models"):   # no toy yet: refused
        from_mergekit(one_model)
    the_class = dict(vars(MergeConfig))
    _declare_toy()
    try:
        assert dict(vars(MergeConfig)) == the_class   # nothing of the class is remade
        # the config: its fields, checks and needs, and its own YAML both ways
        cfg = MergeConfig(method="toy", toy_alpha=0.75, **refs)
        assert cfg.validate(8, has_base=True) is cfg
        with pytest.raises(ConfigError, match="method toy need"):
            MergeConfig(method="toy").validate(8, has_base=False)
        with pytest.raises(ConfigError, match="^toy_alpha: must be a number from 0 to 2"):
            MergeConfig(method="toy", toy_alpha=2.5).check_fields()
        assert "toy_alpha: 0.75\n" in cfg.to_yaml()
        assert MergeConfig.from_yaml(cfg.to_yaml()) == cfg
        assert MergeConfig.from_yaml(cfg.to_yaml()) != replace(cfg, toy_alpha=0.5)
        # a disk merge: every tensor base + alpha * (lang - base), written in float32
        out = merge_to_folder(cfg, out=tmp_path / "toy", **refs)
        merged, base, lang = (CheckpointReader(f) for f in (out, tiny["base"], tiny["lang"]))
        assert merged.names() == base.names()
        for n in merged.names():
            assert torch.equal(merged.get(n).float(), _toy_scale([base.get(n), lang.get(n)],
                                                                 [0.75])), n
        n = "model.layers.0.mlp.up_proj.weight"
        assert not torch.equal(merged.get(n), base.get(n))   # the planted experts differ
        # mergekit's YAML out and in (it names no task expert)
        text, notes = to_mergekit(cfg)
        assert "merge_method: task_arithmetic" in text and any("toy" in x for x in notes)
        assert from_mergekit(text) == replace(cfg, task=None, dtype="float32")
        assert from_mergekit(one_model) == MergeConfig(method="toy", toy_alpha=0.7, lang="b",
                                                       base="z")
        with pytest.raises(ConfigError, match="no toy flag"):
            to_mergekit(replace(cfg, toy_flag=True))
        # the CLI: its flags in the help, a merge and the mergekit YAML from the command line
        with pytest.raises(SystemExit):
            main(["merge", "--help"])
        shown = " ".join(capsys.readouterr().out.split())
        assert "--toy-alpha TOY_ALPHA scale of the lang delta" in shown
        assert "--toy-flag a flag" in shown and "toy" in shown.split("--method")[1][:200]
        args = ["merge", "--method", "toy", "--toy-alpha", "0.75", *(x for r, v in refs.items()
                                                                      for x in (f"--{r}", v))]
        assert main([*args, "--out", str(tmp_path / "cli")]) == 0
        assert CheckpointReader(tmp_path / "cli").get(n).equal(merged.get(n))
        assert main([*args, "--emit-mergekit", str(tmp_path / "toy.yaml")]) == 0
        assert from_mergekit((tmp_path / "toy.yaml").read_text()) == replace(
            cfg, task=None, dtype="float32")
    finally:
        registry.unregister_method("toy")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["merge", "--method", "toy", "--out", str(tmp_path / "gone")])
    assert "invalid choice: 'toy'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="exactly two models"):
        from_mergekit(one_model)


def test_a_method_declared_in_one_place_reaches_config_plan_cli_controls_and_lora():
    from layerswap_core.merge.lora import _coefficients
    from layerswap_core.workbench import controls

    parser_flags = lambda: {o for a in next(a for a in build_parser()._actions  # noqa: E731
                                            if a.dest == "command").choices["plan"]._actions
                            for o in a.option_strings}
    _declare_toy()
    try:
        # MergeConfig: the new knobs are fields with their defaults and declared checks
        cfg = MergeConfig(method="toy")
        assert (cfg.toy_alpha, cfg.toy_flag) == (0.5, False)
        assert list(FIELDS)[-7:] == ["toy_alpha", "toy_flag", "dtype", "tokenizer_source",
                                     "task", "lang", "base"]
        with pytest.raises(ConfigError, match="^toy_alpha: must be a number from 0 to 2"):
            MergeConfig.from_yaml("method: toy\ntoy_alpha: 3\n")
        assert MergeConfig.from_yaml("method: toy\ntoy_alpha: 1\n").toy_alpha == 1.0
        assert cfg.needs_base and "toy" in registry.linear_methods()
        # the plan: every tensor the toy arithmetic, labelled by it, computed by it
        names, arch = llama(4)
        plan = build_plan(MergeConfig(method="toy", toy_alpha=0.25), names, arch)
        src = Source("toy_scale", ("base", "lang"), (0.25,))
        assert set(plan.sources.values()) == {src} and src.label == "toy x0.25"
        assert plan.summary_text().startswith("toy: alpha 0.25")
        out = methods.apply("toy_scale", [torch.zeros(3), torch.full((3,), 4.0)], [0.25])
        assert torch.equal(out, torch.ones(3))
        assert _coefficients(src, cfg) == {"lang": 0.25}          # the LoRA path
        # the CLI: --method choice and one typed flag per new knob
        assert {"--toy-alpha", "--toy-flag"} <= parser_flags()
        args = build_parser().parse_args(["plan", "--method", "toy", "--toy-alpha", "1.5",
                                          "--toy-flag"])
        got = config_from_args(args)
        assert (got.method, got.toy_alpha, got.toy_flag) == ("toy", 1.5, True)
        with pytest.raises(SystemExit):
            build_parser().parse_args(["plan", "--toy-alpha", "half"])
        # the app's controls: a row of the method's own knobs, each its declared widget
        assert controls.method_controls()["toy"] == ("toy_alpha", "toy_flag")
        spec = controls.control_spec("toy_alpha")
        assert (spec.widget, spec.kwargs()) == ("number", {
            "value": 0.5, "label": "toy alpha", "minimum": 0.0, "maximum": 2.0, "step": 0.1})
        assert controls.control_spec("toy_flag").widget == "checkbox"
        assert controls.field_value("toy_alpha", "0.5") == 0.5
        states = controls.control_states("toy scale")
        assert states["toy_alpha"] is None and states["toy_flag"] is None
        assert states["w_task"] is None and states["bottom"] == "not used by toy scale"
        swap = controls.control_states("layer swap")
        assert swap["toy_alpha"] == "not used by layer swap"
        assert "alpha, toy flag (not used by layer swap)" in controls.ignored_text(swap)
        assert wb_configure.METHOD_LABELS["toy scale"] == "toy"
    finally:
        registry.unregister_method("toy")
    # gone everywhere, the knobs and the arithmetic with it; the shared knob stays
    assert "toy_alpha" not in FIELDS and "toy_alpha" not in registry.KNOBS
    assert "w_task" in FIELDS and "toy_scale" not in methods.METHODS
    assert "--toy-alpha" not in parser_flags() and "toy" not in controls.method_controls()
    with pytest.raises(TypeError):
        MergeConfig(toy_alpha=1.0)
    assert "toy_alpha" not in MergeConfig().to_dict()
    assert MergeConfig() == MergeConfig.from_dict(MergeConfig().to_dict())


def test_the_built_in_order_does_not_depend_on_the_import_order():
    """The built-ins register in config.py's one order, whichever method file is imported
    first (the CLI's choices, the app's radio and FIELDS follow it)."""
    import subprocess
    import sys
    code = ("import layerswap_core.merge.method_ties, layerswap_core.merge.method_soup\n"
            "from layerswap_core.merge.registry import MERGE_METHODS\n"
            "assert not MERGE_METHODS\n"
            "from layerswap_core.merge.config import FIELDS\n"
            "print(*MERGE_METHODS, list(FIELDS)[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["layer_swap", "soup", "magnitude_soup", "task_arithmetic",
                                  "ties", "bottom"]


def test_a_knob_or_arithmetic_is_declared_once():
    _declare_toy()
    try:
        with pytest.raises(ValueError, match="registered twice"):
            _declare_toy()
        with pytest.raises(ValueError, match="knob 'w_task' is declared twice, differently"):
            registry.merge_method("toy2", "toy 2", knobs=(registry.Knob("w_task", "bool"),),
                                  sources=dict, describe=str)
        with pytest.raises(ValueError, match="per-tensor method 'ties' is already registered"):
            registry.merge_method("toy2", "toy 2", arithmetic=(methods.tensor_method(
                "ties", _toy_scale, "", "", label=str),), sources=dict, describe=str)
        assert "toy2" not in registry.MERGE_METHODS
    finally:
        registry.unregister_method("toy")
    with pytest.raises(ValueError, match="unknown widget"):
        registry.Knob("x", "number", widget="dial")
    # a method naming existing knobs and arithmetic leaves them when it goes
    registry.merge_method("toy3", "toy 3", knobs=("w_task",), arithmetic=(methods.METHODS["linear"],),
                          sources=dict, describe=str)
    registry.unregister_method("toy3")
    assert "linear" in methods.METHODS and "w_task" in FIELDS and "toy3" not in registry.MERGE_METHODS


def test_a_per_tensor_method_owns_its_label_row_wise_flag_and_lora_coefficients():
    """A new per-tensor method registered once in methods.py: its own plan label (no "ties d=?"
    fallback), whole-tensor unless it says it is row-wise, and no LoRA merge unless it gives its
    coefficients; the built-in ones keep theirs."""
    import torch

    from layerswap_core.merge import methods
    from layerswap_core.merge.apply import BLOCK_BYTES, row_blocks
    from layerswap_core.merge.lora import AdapterError, _coefficients

    methods.register("halfway", "", "midpoint of two models", label=lambda s: "halfway")(
        lambda tensors, weights=None: (tensors[0].float() + tensors[1].float()) / 2)
    try:
        src = Source("halfway", ("task", "lang"), (1.0, 1.0))
        assert src.label == "halfway" and src.shares == {}
        big = (BLOCK_BYTES // 4 // 8 + 1, 8)   # more rows than one block holds
        assert row_blocks(big, "halfway") == [None]
        assert len(row_blocks(big, "linear")) == 2
        with pytest.raises(AdapterError, match="not linear"):
            _coefficients(src, MergeConfig())
        out = methods.apply("halfway", [torch.zeros(2), torch.ones(2)], None)
        assert torch.equal(out, torch.full((2,), 0.5))
    finally:
        methods.METHODS.pop("halfway")
    blend = Source("linear", ("task", "lang"), (3.0, 1.0))
    assert blend.label == "blend 0.75/0.25" and blend.shares == {"task": 0.75, "lang": 0.25}
    assert _coefficients(blend, MergeConfig()) == {"task": 0.75, "lang": 0.25}
    ties = Source("ties", ("base", "task", "lang"), (1.0, 1.0), (("density", 0.3), ("lam", 1.0)))
    assert ties.label == "ties d=0.3" and ties.shares == {}
    assert Source.copy("lang").shares == {"lang": 1.0}


def test_layer_swap_records_its_concrete_layer_counts_through_its_method():
    """The layer-swap special case (the depth-scaled default counts written into the saved
    config) is the method's own ``concrete``; other methods are unchanged by it."""
    cfg = MergeConfig()
    fixed = registry.concrete(cfg, 16)
    assert (cfg.bottom, cfg.top) == (None, None)
    assert (fixed.bottom, fixed.top) == cfg.layer_counts(16)[:2] and fixed.bottom > 0
    assert registry.concrete(MergeConfig(partition="A"), 16).bottom is None
    soup = MergeConfig(method="soup")
    assert registry.concrete(soup, 16) is soup


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_blend_computes_in_place_on_copies_never_on_its_inputs(dtype):
    """``linear`` works in place on float32 copies: float32 inputs (mapped files, the live
    model's own tensors) stay as they were, and the values are the textbook weighted average
    (w_a * a + w_b * b) / (w_a + w_b) in float32, bit for bit."""
    g = torch.Generator().manual_seed(3)
    a, b = (torch.randn(64, 48, generator=g).to(dtype) for _ in range(2))
    a0, b0 = a.clone(), b.clone()
    out = methods.apply("linear", [a, b], [0.37, 0.63])
    assert torch.equal(a, a0) and torch.equal(b, b0)
    assert out.dtype == torch.float32
    assert torch.equal(out, (0.37 * a0.float() + 0.63 * b0.float()) / 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_task_arithmetic_leaves_its_inputs_and_matches_the_formula(dtype):
    g = torch.Generator().manual_seed(4)
    base, t1, t2 = (torch.randn(40, 24, generator=g).to(dtype) for _ in range(3))
    kept = [x.clone() for x in (base, t1, t2)]
    out = methods.apply("task_arithmetic", [base, t1, t2], [0.6, 1.3])
    assert all(torch.equal(x, k) for x, k in zip((base, t1, t2), kept))
    b = kept[0].float()
    assert torch.equal(out, b + (0.6 * (kept[1].float() - b) + 1.3 * (kept[2].float() - b)))


def test_what_callers_ask_of_a_method_is_its_record():
    """Whether a method takes a partition, the knobs a partition replaces (a sweep over them is
    refused) and why mergekit cannot express it on fused experts are fields of its record
    (#63): a toy declaring them gets the built-ins' treatment, with no name branched on."""
    from layerswap_core.sweeps.grid import expand

    assert registry.takes_partition("layer_swap") and not registry.takes_partition("ties")
    assert not registry.takes_partition("no such method")
    assert registry.partition_replaces("no such method") == ()
    assert registry.get_method("ties").mergekit_fused_experts
    registry.merge_method(
        "toy_part", "toy partition", knobs=("partition", "bottom", "top"),
        sources=lambda config, names, arch, blend: dict.fromkeys(names, Source.copy("task")),
        describe=lambda config, num_layers: "toy", partition_replaces=("bottom",),
        mergekit_fused_experts="a toy reason")
    try:
        assert registry.takes_partition("toy_part")
        part = MergeConfig(method="toy_part", partition="A")
        with pytest.raises(ConfigError, match="layer counts do nothing with a partition"):
            expand({"bottom": [1, 2]}, part, 32, True)
        assert len(expand({"top": [1, 2]}, part, 32, True)[0]) == 2   # top: not replaced
        with pytest.raises(ConfigError, match="layer counts do nothing with a partition"):
            expand({"transition": [1]}, MergeConfig(partition="A"), 32, True)
    finally:
        registry.unregister_method("toy_part")


def test_no_merge_method_is_named_in_a_branch_outside_its_file():
    """Outside ``merge/method_*.py``, no comparison of a value with a merge method's id (``x ==
    "ties"``, ``method_id in ("layer_swap", ...)``): callers read the method's record (#63)."""
    import ast
    from pathlib import Path

    ids = set(registry.MERGE_METHODS)
    root = Path(__file__).resolve().parents[1]
    files = [p for d in ("layerswap_core", "app_tabs") for p in (root / d).rglob("*.py")
             if not p.name.startswith("method_")] + [root / "app.py"]
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                names = {c.value for c in ast.walk(node)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                if names & ids:
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == []
