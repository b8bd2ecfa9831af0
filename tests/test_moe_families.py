"""The models people bring (issue #65): tiny random trios of mixture-of-experts and other decoder
types made from transformers' own config classes, merged by a kind rule on the disk, checked by
this test's own name patterns (not layerswap's table), loaded back in transformers; what
`layerswap check` says of them; the refusal of a kind rule that cannot see a model's tensors."""
from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import save_file

from layerswap_core.checkpoints.derive_kinds import tiny_model_config
from layerswap_core.checkpoints.preflight import check
from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.checkpoints.references import DEFAULT_BASE, resolve
from layerswap_core.merge.config import MergeConfig
from layerswap_core.merge.errors import ConfigError
from layerswap_core.merge.executor import merge_to_folder
from layerswap_core.testing import copy_tokenizer, make_expert

MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "deepseek_v3", "llama4_text",
             "granitemoe", "glm4_moe")
TYPES = MOE_TYPES + ("starcoder2", "olmo2", "llama")

# The test's own idea of a decoder layer's parts, from the checkpoints' names: the feed-forward
# block (dense MLP or MoE block: experts, router, shared experts) and the attention.
LAYER = re.compile(r"^model\.layers\.(\d+)\.")
FEED_FORWARD = re.compile(r"^model\.layers\.\d+\.(mlp|block_sparse_moe|feed_forward)\.")
ATTENTION = re.compile(r"^model\.layers\.\d+\.self_attn\.")
EXPERTS = re.compile(r"\.experts\.|\.input_linear\.|\.output_linear\.")
ROUTER = re.compile(r"\.(gate|router)\.")


def tensors(folder) -> dict[str, torch.Tensor]:
    r = CheckpointReader(folder)
    return {n: r.get(n) for n in r.names()}


def make_trio(root, model_type: str) -> dict:
    """base (random, seeded) + two experts with every tensor perturbed differently."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_model_config(model_type))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.08)
    model.save_pretrained(root / "base")
    # a real tokenizer (the live engine loads one); the prompts stay within the tiny vocabulary
    copy_tokenizer(resolve(DEFAULT_BASE), root / "base")
    return {"base": root / "base",
            **{role: make_expert(root / "base", root / role, seed=seed, default_scale=0.3,
                                 global_scale=0.3)
               for role, seed in (("task", 1), ("lang", 2))}}


@pytest.fixture(scope="module", params=TYPES)
def trio(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    return request.param, make_trio(root, request.param)


def test_kind_rule_mlp_takes_every_feed_forward_tensor_from_the_language_expert(trio, tmp_path):
    model_type, paths = trio
    cfg = MergeConfig(partition=[{"layers": "0-1", "kinds": "mlp"}], non_layer="task")
    out = merge_to_folder(cfg, task=paths["task"], lang=paths["lang"], out=tmp_path / "m")
    merged, task, lang = tensors(out), tensors(paths["task"]), tensors(paths["lang"])
    assert set(merged) == set(task)
    ff = [n for n in merged if FEED_FORWARD.match(n)]
    attn = [n for n in merged if ATTENTION.match(n)]
    assert {int(LAYER.match(n).group(1)) for n in ff} == {0, 1} and attn
    if model_type in MOE_TYPES:   # the trio has experts and a router, each taken
        assert any(EXPERTS.search(n) for n in ff) and any(ROUTER.search(n) for n in ff)
    for n in ff:
        assert not torch.equal(task[n], lang[n]), n     # the experts differ there
        assert torch.equal(merged[n], lang[n]), f"{n} not from the language expert"
    for n in attn:
        assert torch.equal(merged[n], task[n]), f"{n} not from the task expert"

    # the merged folder loads in transformers and gives the logits of the same merge done by
    # hand (the test's own patterns) and loaded the same way
    from transformers import AutoModelForCausalLM

    ref = tmp_path / "ref"
    ref.mkdir()
    shutil.copy2(paths["task"] / "config.json", ref / "config.json")
    save_file({n: (lang[n] if FEED_FORWARD.match(n) else task[n]).contiguous() for n in task},
              str(ref / "model.safetensors"), metadata={"format": "pt"})
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(ids).logits
        want = AutoModelForCausalLM.from_pretrained(ref, dtype=torch.float32)(ids).logits
    assert torch.isfinite(got).all() and torch.equal(got, want)


def test_a_single_moe_kind_is_selectable_on_its_own(trio, tmp_path):
    model_type, paths = trio
    if model_type not in MOE_TYPES:
        pytest.skip("dense")
    cfg = MergeConfig(partition=[{"layers": "1", "kinds": "moe_router"}], non_layer="task")
    out = merge_to_folder(cfg, task=paths["task"], lang=paths["lang"], out=tmp_path / "m")
    merged, task, lang = tensors(out), tensors(paths["task"]), tensors(paths["lang"])
    routers = [n for n in merged if n.startswith("model.layers.1.") and FEED_FORWARD.match(n)
               and ROUTER.search(n)]
    assert routers
    for n in merged:
        assert torch.equal(merged[n], (lang if n in routers else task)[n]), n


def test_check_says_family_and_moe(trio):
    model_type, paths = trio
    pf = check(str(paths["base"]), str(paths["task"]), str(paths["lang"]))
    assert pf.ok, pf.refusal
    text = "\n".join(pf.lines())
    assert f"{model_type} ({model_type} family" in text or f"{model_type} (llama family" in text
    if model_type in MOE_TYPES:
        assert "MoE: 4 experts, 2 active" in text
    else:
        assert "dense" in text
    assert "warning" not in text and "unknown family" not in text


def test_models_tab_check_says_moe(trio):
    from layerswap_core.workbench.models import check_models

    model_type, paths = trio
    report = check_models(str(paths["base"]), str(paths["task"]), str(paths["lang"]))
    assert report.ok and not report.notes, report.notes
    arch = report.rows[0][2]
    assert arch.startswith(f"{model_type} (")
    assert ("MoE: 4 experts, 2 active" in arch) == (model_type in MOE_TYPES)


def test_unclassified_tensors_are_said_and_a_kind_rule_over_them_is_refused(tmp_path):
    """A model type layerswap does not know, with a tensor no kind rule can see: `check` names
    it before anything is built, a kinds rule over its layer is refused in one line, a layer
    rule still merges by layer index."""
    from layerswap_core.checkpoints.derive_kinds import known_to_transformers

    assert not known_to_transformers("brand_new_lm")   # no kinds from transformers either
    names = {"model.embed_tokens.weight": (16, 8), "model.norm.weight": (8,),
             "model.layers.0.self_attn.q_proj.weight": (8, 8),
             "model.layers.0.ffn.wi.weight": (16, 8), "model.layers.1.ffn.wi.weight": (16, 8)}
    gen = torch.Generator().manual_seed(0)
    paths = {}
    for role in ("base", "task", "lang"):
        folder = paths[role] = tmp_path / role
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(
            {"model_type": "brand_new_lm", "num_hidden_layers": 2, "hidden_size": 8,
             "vocab_size": 16}))
        save_file({n: torch.randn(s, generator=gen) for n, s in names.items()},
                  str(folder / "model.safetensors"), metadata={"format": "pt"})
    lines = check(str(paths["base"]), str(paths["task"]), str(paths["lang"])).lines()
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 3 and all("model.layers.0.ffn.wi.weight" in w for w in warnings)
    from layerswap_core.workbench.models import check_models

    report = check_models(str(paths["base"]), str(paths["task"]), str(paths["lang"]))
    assert report.ok and any("model.layers.1.ffn.wi.weight" in n for n in report.notes)
    assert "model.layers.0.ffn.wi.weight" in report.markdown()
    rule = MergeConfig(partition=[{"layers": "0-1", "kinds": "mlp"}])
    with pytest.raises(ConfigError, match=r"partition rule 1: .*model\.layers\.0\.ffn\.wi\.weight"):
        merge_to_folder(rule, task=paths["task"], lang=paths["lang"], out=tmp_path / "m")
    assert not (tmp_path / "m").exists()
    other = MergeConfig(partition=[{"layers": "1", "kinds": "mlp, other"}], non_layer="task")
    out = merge_to_folder(other, task=paths["task"], lang=paths["lang"], out=tmp_path / "m2")
    assert torch.equal(tensors(out)["model.layers.1.ffn.wi.weight"],
                       tensors(paths["lang"])["model.layers.1.ffn.wi.weight"])
    by_layer = MergeConfig(partition=[{"layers": "1"}], non_layer="task")
    out = merge_to_folder(by_layer, task=paths["task"], lang=paths["lang"], out=tmp_path / "m3")
    assert torch.equal(tensors(out)["model.layers.1.ffn.wi.weight"],
                       tensors(paths["lang"])["model.layers.1.ffn.wi.weight"])


def test_moe_kinds_are_columns_of_the_delta_heatmap(trio):
    from layerswap_core.analysis.deltas import delta_stats
    from layerswap_core.workbench.figures import delta_heatmap

    model_type, paths = trio
    if model_type not in MOE_TYPES:
        pytest.skip("dense")
    st = delta_stats(paths["base"], paths["task"], cache=False)
    assert {"moe_experts", "moe_router"} <= set(st.kinds()) and "other" not in st.kinds()
    x = list(delta_heatmap(st, matrices_only=True).data[0].x)
    assert "moe experts" in x and "moe router" in x
    fused = [t for t in st.tensors if t.kind == "moe_experts" and len(t.shape) == 3]
    for t in fused:   # a stack of expert matrices: each matrix's rows
        assert t.rows == t.shape[0] * t.shape[1]


def test_a_layer_swap_built_live_gives_the_logits_of_the_saved_merge(trio, tmp_path):
    """The live engine on models whose parameters are not the checkpoint's tensors (experts
    fused by transformers, renamed blocks): each role and merge equals the disk merge loaded."""
    from transformers import AutoModelForCausalLM

    from layerswap_core.merge.live import LiveModel

    model_type, paths = trio
    live = LiveModel.from_refs(paths["task"], paths["lang"], paths["base"])
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    for cfg in (MergeConfig(partition=[{"layers": "0-1", "kinds": "mlp"}], non_layer="task"),
                MergeConfig(bottom=1, top=0, non_layer="blend"),
                MergeConfig(partition=[{"layers": "1", "kinds": "moe_experts"
                                        if model_type in MOE_TYPES else "mlp_down"}])):
        out = merge_to_folder(cfg, task=paths["task"], lang=paths["lang"],
                              out=tmp_path / str(id(cfg)))
        live.show(cfg)
        with torch.no_grad():
            want = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(ids).logits
            got = live.model(ids).logits
        assert torch.equal(got, want), cfg
    live.show("lang")
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(paths["lang"], dtype=torch.float32)(ids).logits
        assert torch.equal(live.model(ids).logits, want)


def test_a_checkpoint_tensor_the_model_keeps_as_a_buffer_is_merged_live(tmp_path):
    """hy_v3 stores its router bias as ``mlp.expert_bias``; transformers loads it into the
    buffer ``mlp.e_score_correction_bias``. A blend built live writes it (it was left at the
    task expert's value: logits off by 2e-4) and equals the disk merge."""
    from transformers import AutoModelForCausalLM

    from layerswap_core.merge.live import LiveModel, checkpoint_buffers

    paths = make_trio(tmp_path, "hy_v3")
    live = LiveModel.from_refs(paths["task"], paths["lang"], paths["base"])
    buffers = checkpoint_buffers(live.model, CheckpointReader(paths["task"]))
    assert "model.layers.1.mlp.e_score_correction_bias" in buffers
    assert "model.layers.1.mlp.expert_bias" in live.names
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    for cfg in (MergeConfig(method="soup"), MergeConfig(bottom=1, top=0)):
        out = merge_to_folder(cfg, task=paths["task"], lang=paths["lang"], base=paths["base"],
                              out=tmp_path / cfg.method / str(cfg.bottom))
        live.show(cfg)
        with torch.no_grad():
            want = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(ids).logits
            assert torch.equal(live.model(ids).logits, want), cfg


# the types whose checkpoints store one tensor per expert, fused into one live parameter
PER_EXPERT = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "glm4_moe")


def test_a_single_expert_rule_writes_that_experts_slice_of_the_fused_parameter(trio, tmp_path):
    """`{layers: '1', experts: '3'}` takes expert 3 of layer 1 (the checkpoint's names) from the
    language expert: on the disk those tensors only; live, that expert's slice of the fused
    parameter only, the logits those of the saved merge. A checkpoint that stores a layer's
    experts in one tensor, or a dense model, is refused in one line."""
    from transformers import AutoModelForCausalLM

    from layerswap_core.merge.live import LiveModel

    model_type, paths = trio
    cfg = MergeConfig(partition=[{"layers": "1", "experts": "3"}], non_layer="task")
    if model_type not in PER_EXPERT:
        why = "no routed experts" if model_type not in MOE_TYPES else "experts in one tensor"
        with pytest.raises(ConfigError, match=f"partition rule 1: selects experts 3, but .*{why}"):
            merge_to_folder(cfg, task=paths["task"], lang=paths["lang"], out=tmp_path / "m")
        assert not (tmp_path / "m").exists()
        return
    out = merge_to_folder(cfg, task=paths["task"], lang=paths["lang"], out=tmp_path / "m")
    merged, task, lang = tensors(out), tensors(paths["task"]), tensors(paths["lang"])
    mine = re.compile(r"^model\.layers\.1\.[a-z_.]*experts\.3\.")
    taken = [n for n in merged if mine.match(n)]
    assert taken
    for n in merged:
        assert torch.equal(merged[n], (lang if n in taken else task)[n]), n

    live = LiveModel.from_refs(paths["task"], paths["lang"])
    fused = {live.place[n] for n in taken}
    assert all(live.place[n] != n for n in taken)   # fused into one live parameter
    before = {p: live.params[p].clone() for p in fused}
    live.show(cfg)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(ids).logits
        assert torch.equal(live.model(ids).logits, want)
        as_lang = AutoModelForCausalLM.from_pretrained(paths["lang"], dtype=torch.float32)
    lang_params = dict(as_lang.named_parameters())
    for p in fused:   # experts on the first axis: only expert 3's slice is the language expert's
        now, was = live.params[p], before[p]
        assert now.shape[0] == 4
        assert torch.equal(now[3], lang_params[p][3]) and not torch.equal(was[3], now[3]), p
        others = [0, 1, 2]
        assert torch.equal(now[others], was[others]), p
    live.show("task")
    for p in fused:
        assert torch.equal(live.params[p], before[p])


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    return make_trio(tmp_path_factory.mktemp("mixtral_only"), "mixtral")


@pytest.mark.parametrize("rule, why", [
    ({"layers": "1", "experts": "4"}, "has 4 experts per layer"),
    ({"layers": "1", "experts": "3", "kinds": "attention"}, "leave out moe_experts"),
    ({"layers": "1", "experts": "three"}, "cannot read 'three'"),
    ({"layers": "1", "experts": "0-99999"}, "below 4096"),
])
def test_an_expert_rule_that_cannot_find_its_experts_is_refused(mixtral, tmp_path, rule, why):
    paths = mixtral
    with pytest.raises(ConfigError, match=f"partition rule 1: .*{why}"):
        merge_to_folder(MergeConfig(partition=[rule]), task=paths["task"], lang=paths["lang"],
                        out=tmp_path / "m")


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    return make_trio(tmp_path_factory.mktemp("qwen3_moe_only"), "qwen3_moe")


def test_a_type_the_table_lacks_is_derived_from_transformers_at_run_time(qwen3_moe, tmp_path,
                                                                          monkeypatch):
    """qwen3_moe dropped from the shipped table: its kinds come from the installed transformers
    when its models are opened, as the table's do (same kind for every checkpoint name, the same
    merged bytes); the caller's random state is left alone."""
    from layerswap_core.checkpoints import architectures

    paths = qwen3_moe
    config = CheckpointReader(paths["task"]).config()
    table = architectures.get_architecture(config)
    assert table.family.name == "qwen3_moe" and not table.family.run_time
    cfg = MergeConfig(partition=[{"layers": "0-1", "kinds": "mlp"}, {"layers": "1",
                                                                     "experts": "2", "to": "task"}],
                      non_layer="task")
    want = merge_to_folder(cfg, task=paths["task"], lang=paths["lang"], out=tmp_path / "table")

    monkeypatch.delitem(architectures._BY_TYPE, "qwen3_moe")
    architectures.run_time_family.cache_clear()
    state = torch.get_rng_state()
    derived = architectures.get_architecture(config)
    assert torch.equal(torch.get_rng_state(), state)
    assert derived.family.run_time and not derived.is_fallback
    assert "derived from transformers' modules at run time" in derived.describe()
    names = CheckpointReader(paths["task"]).names()
    assert [derived.classify(n) for n in names] == [table.classify(n) for n in names]
    assert not derived.unclassified(names)
    got = merge_to_folder(cfg, task=paths["task"], lang=paths["lang"], out=tmp_path / "derived")
    for f in sorted(want.glob("*.safetensors")):
        assert (got / f.name).read_bytes() == f.read_bytes()
    text = "\n".join(check(str(paths["base"]), str(paths["task"]), str(paths["lang"])).lines())
    assert "kinds derived from transformers' modules at run time" in text
    assert "warning" not in text and "unknown family" not in text
    monkeypatch.undo()
    architectures.run_time_family.cache_clear()


def test_a_type_transformers_does_not_know_falls_back_without_deriving():
    from layerswap_core.checkpoints import architectures

    family, why = architectures.run_time_family("brand_new_lm")
    assert family is None and "does not know the model type 'brand_new_lm'" in why
    assert architectures.get_architecture({"model_type": "brand_new_lm",
                                           "num_hidden_layers": 2}).is_fallback


def test_mergekit_yaml_of_a_moe_merge_is_the_same_model_or_refused(trio, tmp_path):
    """For the MoE types mergekit merges whole (``MERGEKIT_MOE``): the YAML layerswap writes,
    run by mergekit, gives the logits of layerswap's own merge (a layer swap with a blend, a
    soup, task arithmetic); TIES on fused experts and single-expert rules are refused. Every
    other MoE type is refused in one line."""
    from transformers import AutoModelForCausalLM

    from layerswap_core.merge.mergekit_yaml import MERGEKIT_MOE, to_mergekit
    from layerswap_core.testing import mergekit_yaml, run_mergekit

    model_type, paths = trio
    if model_type not in MOE_TYPES:
        pytest.skip("dense: tests/test_mergekit_yaml.py")
    refs = {"task": str(paths["task"]), "lang": str(paths["lang"]), "base": str(paths["base"])}
    if model_type not in MERGEKIT_MOE:
        with pytest.raises(ConfigError, match=f"mergekit does not merge the experts of a "
                                              f"{model_type} model"):
            to_mergekit(MergeConfig(method="soup"), **refs)
        return
    if model_type in PER_EXPERT:
        single = MergeConfig(partition=[{"layers": "1", "kinds": "moe_experts"},
                                        {"layers": "1", "experts": "0", "to": "task"}])
        with pytest.raises(ConfigError, match="a rule that takes single experts"):
            to_mergekit(single, **refs)
    ties = MergeConfig(method="ties", ties_density=0.5)
    if MERGEKIT_MOE[model_type]:
        with pytest.raises(ConfigError, match="TIES on a .* fused tensor of all its experts"):
            to_mergekit(ties, **refs)
    if mergekit_yaml() is None:
        pytest.skip("mergekit is not installed")
    cfgs = {"swap": MergeConfig(bottom=1, top=0, w_task=3.0, w_lang=1.0),
            "soup": MergeConfig(method="soup", w_task=3.0, w_lang=1.0),
            "task_arithmetic": MergeConfig(method="task_arithmetic", lambda_task=0.5)}
    jobs = []
    for name, cfg in cfgs.items():
        text, notes = to_mergekit(cfg, **refs)
        assert any("fused" in n for n in notes) == MERGEKIT_MOE[model_type]
        (tmp_path / f"{name}.yaml").write_text(text)
        jobs.append((tmp_path / f"{name}.yaml", tmp_path / f"mk_{name}"))
    run_mergekit(jobs)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    for name, cfg in cfgs.items():
        ours = merge_to_folder(cfg, out=tmp_path / f"ours_{name}",
                               **{r: p for r, p in refs.items() if r != "base" or cfg.needs_base})
        with torch.no_grad():
            want = AutoModelForCausalLM.from_pretrained(ours, dtype=torch.float32)(ids).logits
            got = AutoModelForCausalLM.from_pretrained(tmp_path / f"mk_{name}",
                                                       dtype=torch.float32)(ids).logits
        assert torch.equal(got, want), name
        assert not torch.equal(want, AutoModelForCausalLM.from_pretrained(
            paths["task"], dtype=torch.float32)(ids).logits.detach()), name
