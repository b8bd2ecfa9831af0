"""The app's facade on tiny real models: every tab's function, plain arguments, no browser."""
from __future__ import annotations

import time
import zipfile

import pytest
import torch

from layerswap_core import workbench as wb
from layerswap_core.io import CheckpointReader
from layerswap_core.plan import ConfigError, MergeConfig


@pytest.fixture(scope="module")
def session(tiny):
    s, report = wb.open_session(str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    assert report.ok, report.problems
    return s


def swap(session, b, u, tb=0, tu=0, **kw):
    return wb.make_config(session, "layer swap", b, u, tb, tu, **kw)


# --------------------------------------------------------------------------- models
def test_check_models_reads_headers(tiny):
    report = wb.check_models(str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    assert report.ok and report.num_layers == 8
    assert [r[0] for r in report.rows] == ["base", "task expert", "language expert"]
    assert all(r[3] == "8" and r[4] == "64" for r in report.rows)
    assert "Compatible" in report.markdown()


def test_incompatible_models_are_reported_not_opened(tiny, embedded_base):
    session, report = wb.open_session(str(tiny["base"]), str(embedded_base), str(tiny["lang"]))
    assert session is None and not report.ok
    assert "30 layers" in report.markdown() and "8 layers" in report.markdown()


@pytest.mark.parametrize("ref, words", [
    ("/no/such/folder", "no such folder"),
    ("nobody/no-such-model", "offline"),
])
def test_bad_references_give_readable_errors(tiny, ref, words):
    with pytest.raises(wb.WorkbenchError) as e:
        wb.open_session(str(tiny["base"]), ref, str(tiny["lang"]))
    msg = wb.readable_error(e.value)
    assert words in msg and "Traceback" not in msg and "task expert" in msg


def test_missing_expert_is_a_readable_error(tiny):
    with pytest.raises(wb.WorkbenchError, match="language expert"):
        wb.check_models(str(tiny["base"]), str(tiny["task"]), "  ")


# --------------------------------------------------------------------------- configure
def test_config_validation_messages(session):
    with pytest.raises(ConfigError, match="exceeds the model's 8 layers"):
        swap(session, 5, 3, 1, 0)
    cfg = wb.make_config(session, "layer swap", 2, 1, 0, 0, partition="custom",
                         custom_rules="first 2 : mlp\n# comment\nall : attention")
    assert cfg.partition == [{"layers": "first 2", "kinds": "mlp"},
                             {"layers": "all", "kinds": "attention"}]
    with pytest.raises(wb.WorkbenchError, match="at least one rule"):
        wb.make_config(session, "layer swap", 2, 1, partition="custom", custom_rules="# none")
    assert wb.make_config(session, "TIES").method == "ties"


def test_plan_view_follows_the_sliders_without_reading_tensors(session, monkeypatch):
    reads = []
    monkeypatch.setattr(CheckpointReader, "get", lambda self, n, *a, **k: reads.append(n))
    fig_a, text_a = wb.plan_view(session, swap(session, 2, 1))
    fig_b, text_b = wb.plan_view(session, swap(session, 3, 2, 1, 0))
    cells_a = wb.plan_cells_figure(session, swap(session, 2, 1))
    cells_b = wb.plan_cells_figure(session, wb.make_config(session, "layer swap", partition="A"))
    assert reads == []
    assert cells_a.to_json() != cells_b.to_json()
    assert text_a != text_b and "0-1       lang" in text_a and "0-2       lang" in text_b
    assert fig_a.to_json() != fig_b.to_json()


# --------------------------------------------------------------------------- build / save / zip
def _tensor(folder, name):
    with CheckpointReader(folder) as r:
        return r.get(name)


def test_build_in_memory_then_only_changed_layers(session, tiny):
    first = wb.build(session, swap(session, 2, 1))
    assert first.changed == first.total
    state = session.merged[0].state_dict()
    q = "model.layers.{}.self_attn.q_proj.weight"
    assert torch.equal(state[q.format(0)], _tensor(tiny["lang"], q.format(0)))
    assert torch.equal(state[q.format(3)], _tensor(tiny["task"], q.format(3)))
    assert torch.equal(state[q.format(7)], _tensor(tiny["lang"], q.format(7)))
    t0 = time.perf_counter()
    second = wb.build(session, swap(session, 3, 1))     # only layer 2 changes source
    assert time.perf_counter() - t0 < 5
    assert 0 < second.changed < first.total / 4
    state = session.merged[0].state_dict()
    assert torch.equal(state[q.format(2)], _tensor(tiny["lang"], q.format(2)))
    assert "Built in memory" in second.markdown()


def test_save_and_zip(session, tmp_path):
    cfg = swap(session, 2, 1)
    out = wb.save(session, cfg, str(tmp_path / "merged"))
    assert (out / "config.json").exists() and (out / "layerswap.yaml").exists()
    with pytest.raises(Exception) as e:
        wb.save(session, cfg, str(tmp_path / "merged"))
    assert "exists" in wb.readable_error(e.value)
    z = wb.export_zip(session, cfg, str(tmp_path))
    with zipfile.ZipFile(z) as f:
        assert set(f.namelist()) == {"layerswap.yaml", "README.md"}
        again = MergeConfig.from_yaml(f.read("layerswap.yaml").decode())
    assert again.layer_counts(8) == cfg.layer_counts(8)


# --------------------------------------------------------------------------- deltas
def test_delta_views_and_suggestion(session):
    v = wb.delta_views(session)
    assert v.threshold > 0
    # the tiny language expert changed layers 0, 1 and 7: the suggestion swaps the bottom ones
    assert v.suggestion.bottom >= 1 and "bottom" in v.suggestion_text
    assert wb.plan_cells_figure(session, swap(session, 2, 1), over="lang").data
    w = wb.delta_views(session, v.threshold * 10)
    assert w.heatmaps.to_json() != v.heatmaps.to_json()


# --------------------------------------------------------------------------- evaluate / sweep
def test_evaluate_side_by_side(session):
    wb.build(session, swap(session, 2, 1))
    res = wb.evaluate(session, "mgsm", "sw", n=2, shots=1, roles=("task", "merged"),
                      max_new_tokens=8)
    assert len(res.rows) == 2 and len(res.rows[0]) == len(res.headers)
    assert [r[0] for r in res.summary_rows] == ["task expert", "merged"]
    with pytest.raises(wb.WorkbenchError, match="between 1 and"):
        wb.evaluate(session, "mgsm", "sw", n=wb.LIMITS.eval_questions + 1)


def test_sweep_grid(session):
    wb.build(session, swap(session, 3, 2))
    res = wb.sweep(session, swap(session, 2, 1), "bottom / top", "0,2", "1,7", "gsm-symbolic",
                   "sw", n=2, metric="nll")
    assert res.xs == [0, 2] and res.ys == [1, 7]
    assert res.scores[1][1] is None              # 2 + 7 > 8 layers: impossible, skipped
    assert all(s is not None and s > 0 for s in (res.scores[0][0], res.scores[0][1], res.scores[1][0]))
    assert len(res.rows) == 3
    assert [r[2] for r in res.rows] == sorted(r[2] for r in res.rows)   # best (lowest NLL) first
    assert res.best == res.rows[0]
    assert {tuple(r[:2]) for r in res.rows} == {(0, 1), (2, 1), (0, 7)}
    assert session.built_config.layer_counts(8) == (3, 2, 0, 0)   # the visitor's build is back
    assert session.recomposer.plan.config.layer_counts(8) == (3, 2, 0, 0)
    with pytest.raises(wb.WorkbenchError, match="outside"):
        wb.sweep(session, swap(session, 2, 1), "bottom / top", "0-9", "0")


# --------------------------------------------------------------------------- chat
def test_chat_streams_and_rejects_empty(session):
    wb.build(session, swap(session, 2, 1))
    steps = [[dict(m) for m in r.history]
             for r in wb.chat(session, "Habari?", [], "merged", max_new_tokens=12)]
    assert steps and all(len(h) == 2 for h in steps)
    final = steps[-1]
    assert final[0] == {"role": "user", "content": "Habari?"} and final[1]["content"]
    with pytest.raises(wb.WorkbenchError, match="type a message"):
        next(wb.chat(session, "   ", [], "merged"))
    gradio_style = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "jambo"}]}]
    assert wb.plain_history(gradio_style) == [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "jambo"}]


# --------------------------------------------------------------------------- cancel, hub, sessions
def test_cancel_stops_the_job_between_steps(session):
    seen = []

    def press_cancel(frac, msg):
        seen.append(msg)
        session.cancel.set()         # the visitor presses Cancel during the first step

    with pytest.raises(wb.Cancelled):
        wb.evaluate(session, "mgsm", "sw", n=2, shots=0, roles=("task",), max_new_tokens=4,
                    progress=press_cancel)
    assert len(seen) == 1 and wb.readable_error(wb.Cancelled()) == "Cancelled."
    wb.evaluate(session, "mgsm", "sw", n=1, shots=0, roles=("task",), max_new_tokens=4)  # works again


def test_push_needs_token_and_network(session, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_dummy")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert wb.hub_token() is None
    with pytest.raises(wb.WorkbenchError, match="network and a token"):
        wb.push_to_hub(session, swap(session, 2, 1), "me/merged")


def test_sessions_do_not_share_merged_models(session, tiny):
    other, _ = wb.open_session(str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    wb.build(session, swap(session, 2, 1))
    with pytest.raises(wb.WorkbenchError, match="build the merged model first"):
        other.model("merged")
    wb.build(other, swap(other, 0, 0))
    assert session.merged[0] is not other.merged[0]
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(session.merged[0].state_dict()[q], other.merged[0].state_dict()[q])
    wb.close_session(other)
    assert other.merged is None


def test_peft_adapter_is_picked_as_a_dense_expert(tiny, tmp_path, monkeypatch):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "cache"))  # the dense copy goes there
    base = AutoModelForCausalLM.from_pretrained(tiny["base"], dtype=torch.float32)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                           init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    expected = lora.merge_and_unload().state_dict()
    session, report = wb.open_session(str(tiny["base"]), str(tmp_path / "adapter"), str(tiny["lang"]))
    assert report.ok and session is not None
    q = "model.layers.3.self_attn.q_proj.weight"
    dense = _tensor(session.paths["task"], q)
    assert torch.equal(dense, expected[q]) and not torch.equal(dense, _tensor(tiny["base"], q))
    with pytest.raises(wb.WorkbenchError, match="give its base model"):
        wb.check_models("", str(tmp_path / "adapter"), str(tiny["lang"]))


def test_warm_up_loads_the_source_models_once(session):
    wb.warm_up(session).join(timeout=120)
    loaded = {k[0] for k in wb.SOURCE_MODELS._items}
    assert {str(p) for p in session.paths.values()} <= loaded
    assert session.model("task") is session.model("task")     # shared, not reloaded


@pytest.mark.slow
def test_the_embedded_demo_is_preselected_and_compatible():
    experts = pytest.importorskip("layerswap_core.experts")
    missing = [r for r in (experts.DEMO_TASK, experts.DEMO_LANG)
               if not (experts.demo_adapter_dir(r) / "adapter_model.safetensors").exists()]
    if missing:
        pytest.skip(f"demo expert adapters not shipped in assets/experts: {missing}")
    assert wb.DEMO_REFS == {"base": experts.DEMO_BASE, "task": experts.DEMO_TASK,
                            "lang": experts.DEMO_LANG}
    report = wb.check_models(**wb.DEMO_REFS)
    assert report.ok, report.problems
    assert report.num_layers == 30


def test_spaces_gpu_decorator_is_a_no_op_without_spaces():
    from layerswap_core import spaces

    if spaces.HAVE_SPACES:
        pytest.skip("the spaces package is installed here")

    def work(x):
        return x + 1
    assert spaces.GPU(work) is work and spaces.GPU(duration=30)(work) is work
