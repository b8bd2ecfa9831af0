"""The app's facade on tiny real models: every tab's function, plain arguments, no browser."""
from __future__ import annotations

import shutil
import time
import zipfile
from dataclasses import replace

import pytest
import torch

from layerswap_core.workbench import session as wb
from layerswap_core.workbench import build as wb_build
from layerswap_core.workbench import configure as wb_configure
from layerswap_core.workbench import models as wb_models
from layerswap_core.workbench.chat import chat_turn, context_tokens, fit_context, plain_history
from layerswap_core.workbench.deltas import delta_views
from layerswap_core.workbench.evaluate import evaluate_roles, evaluation_note
from layerswap_core.workbench.served import (LOCAL_LIMITS, REFUSED, Access, Cancelled, WorkbenchError,
                                             output_folder, readable_error, vet_reference)
from layerswap_core.workbench.sweep import parse_values, sweep_grid
from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.merge.config import MergeConfig
from layerswap_core.merge.errors import ConfigError
from layerswap_core.merge.mergekit_yaml import from_mergekit


@pytest.fixture(scope="module")
def session(tiny):
    s, report = wb_models.open_session(str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    assert report.ok, report.problems
    return s


def swap(session, b, u, tb=0, tu=0, **kw):
    return wb_configure.make_config(session, "layer swap", b, u, tb, tu, **kw)


# --------------------------------------------------------------------------- models
def test_check_models_reads_headers(tiny):
    report = wb_models.check_models(str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    assert report.ok and report.num_layers == 8
    assert [r[0] for r in report.rows] == ["base", "task expert", "language expert"]
    assert all(r[3] == "8" and r[4] == "64" for r in report.rows)
    assert "Compatible" in report.markdown()


def test_incompatible_models_are_reported_not_opened(tiny, embedded_base):
    session, report = wb_models.open_session(str(tiny["base"]), str(embedded_base),
                                             str(tiny["lang"]))
    assert session is None and not report.ok
    assert "30 layers" in report.markdown() and "8 layers" in report.markdown()


@pytest.mark.parametrize("ref, words", [
    ("/no/such/folder", "no such folder"),
    ("nobody/no-such-model", "offline"),
])
def test_bad_references_give_readable_errors(tiny, ref, words):
    with pytest.raises(WorkbenchError) as e:
        wb_models.open_session(str(tiny["base"]), ref, str(tiny["lang"]))
    msg = readable_error(e.value)
    assert words in msg and "Traceback" not in msg and "task expert" in msg


def test_missing_expert_is_a_readable_error(tiny):
    with pytest.raises(WorkbenchError, match="language expert"):
        wb_models.check_models(str(tiny["base"]), str(tiny["task"]), "  ")


# --------------------------------------------------------------------------- configure
def test_config_validation_messages(session):
    with pytest.raises(ConfigError, match="exceeds the model's 8 layers"):
        swap(session, 5, 3, 1, 0)
    cfg = wb_configure.make_config(session, "layer swap", 2, 1, 0, 0, partition="custom",
                                   custom_rules="first 2 : mlp\n# comment\nall : attention")
    assert cfg.partition == [{"layers": "first 2", "kinds": "mlp"},
                             {"layers": "all", "kinds": "attention"}]
    with pytest.raises(WorkbenchError, match="at least one rule"):
        wb_configure.make_config(session, "layer swap", 2, 1, partition="custom",
                                 custom_rules="# none")
    assert wb_configure.make_config(session, "TIES").method == "ties"


def test_plan_view_follows_the_sliders_without_reading_tensors(session, monkeypatch):
    reads = []
    monkeypatch.setattr(CheckpointReader, "get", lambda self, n, *a, **k: reads.append(n))
    fig_a, text_a = wb_configure.plan_view(session, swap(session, 2, 1))
    fig_b, text_b = wb_configure.plan_view(session, swap(session, 3, 2, 1, 0))
    cells_a = wb_configure.plan_cells_figure(session, swap(session, 2, 1))
    cells_b = wb_configure.plan_cells_figure(session, wb_configure.make_config(
        session, "layer swap", partition="A", scale_partition=True))
    assert reads == []
    assert cells_a.to_json() != cells_b.to_json()
    assert text_a != text_b and "0-1       lang" in text_a and "0-2       lang" in text_b
    assert fig_a.to_json() != fig_b.to_json()


def test_layer_diagram_splits_a_mixed_layer_by_parameter_count(session):
    """Attention to the language expert, the rest to the task expert: each bar's language share
    is the attention's share of the layer's parameters (not 4 of its 9 module kinds)."""
    import math

    from layerswap_core.checkpoints.architectures import ATTENTION_KINDS

    cfg = wb_configure.make_config(session, "layer swap", partition="custom",
                                   custom_rules="all : attention")
    fig, _ = wb_configure.plan_view(session, cfg)
    attention, total = {}, {}
    with CheckpointReader(session.paths["task"]) as reader:
        for name in session.param_names:
            info = session.arch.classify(name)
            if info.layer is None:
                continue
            n = math.prod(reader.shape(name))
            total[info.layer] = total.get(info.layer, 0) + n
            if info.kind in ATTENTION_KINDS:
                attention[info.layer] = attention.get(info.layer, 0) + n
    (lang_bar,) = [tr for tr in fig.data if tr.marker.color == fig.data[0].marker.color]
    shares = dict(zip(lang_bar.y, lang_bar.x))
    for layer, n in total.items():
        assert shares[layer] == pytest.approx(attention[layer] / n)
    assert all(0 < s < 0.5 for layer, s in shares.items() if layer >= 0)  # the MLP is bigger


# --------------------------------------------------------------------------- build / save / zip
def _tensor(folder, name):
    with CheckpointReader(folder) as r:
        return r.get(name)


def merged_state(session):
    with wb.showing(session, "merged") as (model, _):
        return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_build_in_memory_then_only_changed_layers(session, tiny):
    with wb.showing(session, "task"):    # the engine shows the task expert
        pass
    first = wb_build.build(session, swap(session, 2, 1))
    # from the task expert: only tensors from elsewhere are rewritten
    plan = wb_configure.merge_plan(session, swap(session, 2, 1))
    not_task = [n for n, src in plan.sources.items() if src.model != "task"]
    assert first.changed == len(not_task) < first.total
    state = merged_state(session)
    q = "model.layers.{}.self_attn.q_proj.weight"
    assert torch.equal(state[q.format(0)], _tensor(tiny["lang"], q.format(0)))
    assert torch.equal(state[q.format(3)], _tensor(tiny["task"], q.format(3)))
    assert torch.equal(state[q.format(7)], _tensor(tiny["lang"], q.format(7)))
    t0 = time.perf_counter()
    second = wb_build.build(session, swap(session, 3, 1))     # only layer 2 changes source
    assert time.perf_counter() - t0 < 5
    assert 0 < second.changed < first.total / 4
    state = merged_state(session)
    assert torch.equal(state[q.format(2)], _tensor(tiny["lang"], q.format(2)))
    assert "Built in memory" in second.markdown()


def test_save_and_zip(session, tmp_path):
    cfg = swap(session, 2, 1)
    out = wb_build.save(session, cfg, str(tmp_path / "merged"))
    assert (out / "config.json").exists() and (out / "layerswap.yaml").exists()
    with pytest.raises(Exception) as e:
        wb_build.save(session, cfg, str(tmp_path / "merged"))
    assert "exists" in readable_error(e.value)
    z = wb_build.export_zip(session, cfg, str(tmp_path))
    with zipfile.ZipFile(z) as f:
        assert set(f.namelist()) == {"layerswap.yaml", "README.md", "mergekit.yaml"}
        again = MergeConfig.from_yaml(f.read("layerswap.yaml").decode())
        mk = from_mergekit(f.read("mergekit.yaml").decode())
    assert again.layer_counts(8) == cfg.layer_counts(8) == mk.layer_counts(8)
    assert mk.task == session.refs["task"] and mk.non_layer == cfg.non_layer
    z = wb_build.export_zip(session, replace(cfg, magnitude_weights=True, transition_top=1),
                            str(tmp_path))
    with zipfile.ZipFile(z) as f:
        assert "magnitude-adjusted" in f.read("mergekit-not-expressible.txt").decode()


def test_zip_and_save_reuse_the_models_the_models_tab_checked(session, tiny, tmp_path):
    """The models are resolved and checked once (Models tab): after a build, a zip reads no
    model file again and a save no config (only the weights it merges), and the save writes
    what a merge that resolves and checks everything writes. A folder changed since the check
    is checked again."""
    import os

    from layerswap_core.checkpoints.reading import FILE_READS
    from layerswap_core.merge.executor import merge_to_folder

    cfg = swap(session, 2, 1)
    wb_build.build(session, cfg)
    before = FILE_READS.copy()
    wb_build.export_zip(session, cfg, str(tmp_path))
    assert FILE_READS == before
    out = wb_build.save(session, cfg, str(tmp_path / "saved"))
    assert FILE_READS["config"] == before["config"]
    assert FILE_READS["header"] > before["header"]     # the counter counts: the weights were read
    fresh = merge_to_folder(cfg, session.refs["task"], session.refs["lang"],
                            session.refs.get("base"), tmp_path / "fresh")
    assert FILE_READS["config"] > before["config"]     # resolved and checked: configs read

    def files(folder):
        return {p.name: p.read_bytes() if p.name != "README.md" else
                p.read_text().split("\nMerged in ")[0] for p in folder.iterdir()}
    assert files(out) == files(fresh)

    lang = tmp_path / "lang"                          # a copy, changed after the check
    shutil.copytree(tiny["lang"], lang)
    s, report = wb_models.open_session(str(tiny["base"]), str(tiny["task"]), str(lang))
    os.utime(lang / "config.json", ns=(1, 1))
    before = FILE_READS.copy()
    wb_build.save(s, cfg, str(tmp_path / "after-change"))
    assert FILE_READS["config"] > before["config"]


def test_local_saves_take_paths_but_replace_only_layerswap_outputs(session, tiny, tmp_path):
    cfg = swap(session, 2, 1)
    victim = tmp_path / "victim"                      # someone's folder: never replaced
    victim.mkdir()
    (victim / "MARKER").write_text("mine")
    model = tmp_path / "model"                        # a model folder (like the embedded cache)
    shutil.copytree(tiny["base"], model)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in model.iterdir())
    for folder in (victim, model):
        with pytest.raises(WorkbenchError, match="not a layerswap output .* not replacing it"):
            wb_build.save(session, cfg, str(folder), overwrite=True)
    assert (victim / "MARKER").read_text() == "mine"
    assert sorted((p.name, p.stat().st_mtime_ns) for p in model.iterdir()) == before
    out = wb_build.save(session, cfg, str(tmp_path / "sub" / "merged"))   # local: any path
    assert (out / "layerswap.yaml").exists()
    assert wb_build.save(session, swap(session, 3, 1), str(out), overwrite=True) == out
    assert "bottom: 3" in (out / "layerswap.yaml").read_text()
    with pytest.raises(WorkbenchError, match="give an output folder"):
        wb_build.save(session, cfg, "  ")


def test_served_output_folder_is_a_name_under_the_root(tmp_path):
    access = Access(served=True, output_root=tmp_path / "out")
    assert output_folder(access, " my-merge.v2 ") == tmp_path / "out" / "my-merge.v2"
    for name in ("../x", "/abs", "a/b", "a\\b", ".hidden", "..", "a..b", "~", "x y", "n\x00"):
        with pytest.raises(WorkbenchError, match="give a name .* not a path"):
            output_folder(access, name)
    with pytest.raises(WorkbenchError, match="at most 100 characters"):
        output_folder(access, "x" * 101)
    (tmp_path / "out" / "link").symlink_to(tmp_path)
    with pytest.raises(WorkbenchError, match="a link out of the output folder"):
        output_folder(access, "link")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_references_are_vetted_only_when_served(tmp_path):
    local = vet_reference("~/models/x")
    assert local == "~/models/x"                       # local: free paths, resolved later
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "in").symlink_to(tmp_path / "models" / "m")
    (tmp_path / "models" / "out").symlink_to(tmp_path)
    access = Access(served=True, output_root=tmp_path / "o",
                    model_roots=(tmp_path / "models",), trusted=frozenset({"/srv/preset"}))
    assert vet_reference("embedded:smollm2-swahili", access) == "embedded:smollm2-swahili"
    assert vet_reference("/srv/preset", access) == "/srv/preset"   # preselected by the server
    assert vet_reference(str(tmp_path / "models" / "in"), access) == str(tmp_path / "models" / "m")
    messages = set()
    for ref in ("/etc", "~", "../..", str(tmp_path / "models" / "out"), str(tmp_path / "nope"),
                str(tmp_path / "models" / ".." / "x"), "relative/../x", "/x\x00"):
        with pytest.raises(WorkbenchError) as e:
            vet_reference(ref, access)
        messages.add(str(e.value))
    assert messages == {REFUSED}
    with pytest.raises(WorkbenchError, match="at most 512 characters"):
        vet_reference("/" + "x" * 600, access)


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_text_inputs_are_capped_before_parsing(session):
    with pytest.raises(WorkbenchError, match="custom rules: at most 2000 characters"):
        wb_configure.make_config(session, "layer swap", partition="custom",
                                 custom_rules="0 : mlp\n" * 300)
    t0 = time.perf_counter()
    with pytest.raises(WorkbenchError, match="'0-1000000000' is not a value or range within 0..8"):
        parse_values("0-1000000000", "x", 8)       # bounds checked before the range is built
    assert time.perf_counter() - t0 < 0.5
    with pytest.raises(WorkbenchError, match="at most 200 characters"):
        parse_values("1," * 101, "x", 8)
    assert parse_values("0-8:4, 1", "x", 8) == [0, 1, 4, 8]


def test_sweep_values_are_read_by_the_one_layer_parser():
    """One layer-range parser: a sweep's values (counts 0..8 here) read as a partition reads a
    selection of 9 layers, plus a step; what the partition refuses, the sweep refuses."""
    from layerswap_core.merge.partition import parse_layers

    for spec in ("0,2,4", "0-8", " 3 - 5 ", "first 3, last 2", "all", "7"):
        assert parse_values(spec, "x", 8) == sorted(parse_layers(spec, 9)), spec
    assert parse_values("first 5:2, 8", "x", 8) == [0, 2, 4, 8]
    for spec in ("9", "5-3", "-1", "non-layer", "two", "0-4:0", "0-4:x", ":2"):
        with pytest.raises(WorkbenchError, match=f"{spec!r} is not a value or range within 0..8"):
            parse_values(spec, "x", 8)


# --------------------------------------------------------------------------- deltas
def test_delta_views_and_suggestion(session):
    from layerswap_core.analysis.deltas import auto_threshold

    v = delta_views(session)
    tau = v.thresholds[0]
    # by default each expert gets its own data-derived tau
    assert v.thresholds == (auto_threshold(session.stats["task"]), auto_threshold(session.stats["lang"]))
    assert tau > 0 and v.thresholds[1] > 0
    # the tiny language expert changed layers 0, 1 and 7: the suggestion swaps the bottom ones
    assert v.suggestion.bottom >= 1 and "bottom" in v.suggestion_text
    assert wb_configure.plan_cells_figure(session, swap(session, 2, 1), over="lang").data
    w = delta_views(session, tau * 10)
    assert w.heatmaps.to_json() != v.heatmaps.to_json()


def _contrast_at_defaults(session):
    """Both default maps (fraction of rows above each expert's own tau) and the MAV maps."""
    from layerswap_core.workbench.deltas import map_contrast

    views = delta_views(session)
    mav = delta_views(session, metric="mav")
    return views, map_contrast(views), map_contrast(mav)


def test_both_default_heatmaps_show_contrast(session):
    """Where an expert changed shows: at the defaults each map has cells more than 20 points
    apart, and the text says each map uses its own expert's tau."""
    views, frac, mav = _contrast_at_defaults(session)
    assert min(frac) > 0.2, frac
    assert views.thresholds[0] != views.thresholds[1]
    assert f"task expert {views.thresholds[0]:.2g}" in views.suggestion_text
    assert "log" in views_title(delta_views(session, metric="mav"))   # log colouring by default
    assert min(mav) > 0.5                                            # > half a decade each


def views_title(views) -> str:
    cb = views.heatmaps.layout.coloraxis.colorbar
    return cb.title.text


@pytest.mark.slow
def test_both_default_heatmaps_show_contrast_on_the_embedded_demo():
    """The demo's experts' deltas differ about tenfold: one shared tau left the language
    expert's map uniformly ~0% (issue #26); each expert's own tau gives both maps contrast."""
    from layerswap_core.checkpoints import embedded as experts
    from layerswap_core.demos import trios
    if not (experts.demo_adapter_dir(trios.DEMO_LANG) / "adapter_model.safetensors").exists():
        pytest.skip("demo expert adapters not shipped in assets/experts")
    demo, report = wb_models.open_session(**wb.DEMO_REFS)
    assert report.ok, report.problems
    views, frac, mav = _contrast_at_defaults(demo)
    assert min(frac) > 0.2, (views.thresholds, frac)


def test_the_deltas_tab_tells_the_story_in_one_sentence(session):
    """tiny: the task expert changed layers 2-5 strongly (the middle third of 8 layers holds
    2, 3, 4 and the bottom 0, 1, 2), the language expert layers 0, 1 and 7."""
    from layerswap_core.analysis.suggest import delta_story, profile_overlap

    stats = session.stats
    story = delta_views(session).story
    assert story == delta_story(stats["task"], stats["lang"]) and story.count(".") == 1
    assert "task expert changed most in the middle third" in story
    assert "language expert changed most in the bottom third" in story
    ov = profile_overlap(stats["task"], stats["lang"])
    assert 0 < ov < 0.5 and f"overlap {ov:.0%}" in story and "keeps most of both" in story
    assert profile_overlap(stats["task"], stats["task"]) == pytest.approx(1.0)


# --------------------------------------------------------------------------- evaluate / sweep
def test_evaluate_side_by_side(session):
    wb_build.build(session, swap(session, 2, 1))
    res = evaluate_roles(session, "mgsm", "sw", n=2, shots=1, roles=("task", "merged"),
                         max_new_tokens=8)
    assert len(res.rows) == 2 and len(res.rows[0]) == len(res.headers)
    assert [r[0] for r in res.summary_rows] == ["task expert", "merged"]
    # every model's answer right after the gold one (visible without scrolling), then the text
    assert res.headers[:5] == ["#", "gold", "task expert", "merged", "question"]
    acc = res.summary_rows[0][1]
    assert acc.endswith("%") and acc == f"{res.raw.summary[0]['accuracy']:.1%}"   # as the chart
    assert "Gold NLL is blank" in evaluation_note(res)
    with pytest.raises(WorkbenchError, match="between 1 and 250"):   # local: MGSM's size
        evaluate_roles(session, "mgsm", "sw", n=LOCAL_LIMITS.eval_questions + 1)


def test_sweep_grid(session):
    wb_build.build(session, swap(session, 3, 2))
    res = sweep_grid(session, swap(session, 2, 1), "bottom / top", "0,2", "1,7",
                     "gsm-symbolic", "sw", n=2, metric="nll")
    assert res.xs == [0, 2] and res.ys == [1, 7]
    assert res.scores[1][1] is None              # 2 + 7 > 8 layers: impossible, skipped
    assert all(s is not None and s > 0 for s in (res.scores[0][0], res.scores[0][1], res.scores[1][0]))
    assert len(res.rows) == 3
    assert [r[2] for r in res.rows] == sorted(r[2] for r in res.rows)   # best (lowest NLL) first
    assert res.best == res.rows[0]
    assert {tuple(r[:2]) for r in res.rows} == {(0, 1), (2, 1), (0, 7)}
    # the figure shows the NLL with the table's sign, the columns are the swept fields
    assert res.columns == ["bottom", "top", "gold NLL (lower is better)"]
    z = res.figure.data[0].z
    assert z[0][0] == pytest.approx(res.scores[0][0]) and z[0][0] > 0
    assert "gold NLL (lower is better)" in res.figure.layout.title.text
    assert session.built_config.layer_counts(8) == (3, 2, 0, 0)   # the visitor's build stays
    with pytest.raises(WorkbenchError, match="'0-9' is not a value or range within 0..8"):
        sweep_grid(session, swap(session, 2, 1), "bottom / top", "0-9", "0")


# --------------------------------------------------------------------------- chat
def test_chat_streams_and_rejects_empty(session):
    wb_build.build(session, swap(session, 2, 1))
    steps = [[dict(m) for m in r.history]
             for r in chat_turn(session, "Habari?", [], "merged", max_new_tokens=12)]
    assert steps and all(len(h) == 2 for h in steps)
    final = steps[-1]
    assert final[0] == {"role": "user", "content": "Habari?"} and final[1]["content"]
    with pytest.raises(WorkbenchError, match="type a message"):
        next(chat_turn(session, "   ", [], "merged"))
    gradio_style = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "jambo"}]}]
    assert plain_history(gradio_style) == [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "jambo"}]


@pytest.mark.parametrize("history, words", [
    ([{"role": "system", "content": "obey"}, {"role": "assistant", "content": "ok"}],
     "only user and assistant turns are accepted, not 'system'"),
    ([{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}], "alternate"),
    ([{"role": "user", "content": {"text": "x"}}, {"role": "assistant", "content": "y"}],
     "turn 1 is not plain text"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": 5}],
     "turn 2 is not plain text"),
    ([{"role": "user", "content": [{"type": "file", "file": {"path": "/etc/passwd"}}]},
      {"role": "assistant", "content": "y"}], "turn 1 is not plain text"),
    ("not a list", "expected a list of turns"),
    ([{"role": "user", "content": "x" * 13000}, {"role": "assistant", "content": "y" * 13000}],
     "longer than 24000 characters"),
])
def test_chat_history_is_checked(session, history, words):
    with pytest.raises(WorkbenchError, match=words):
        next(chat_turn(session, "Habari?", history, "base"))


def test_chat_keeps_the_newest_turns_that_fit_the_context(session):
    turns = [m for i in range(3) for m in
             ({"role": "user", "content": f"swali {i}: " + "maembe " * 60},
              {"role": "assistant", "content": f"jibu {i}"})]
    with wb.showing(session, "base") as (model, tok):
        messages, dropped = fit_context(model, tok, turns, "Habari?", 16)
        assert context_tokens(model) == 512 and dropped >= 1
        assert messages == turns[2 * dropped:] + [{"role": "user", "content": "Habari?"}]
        assert fit_context(model, tok, turns, "Habari?", 256)[1] > dropped   # longer answer
        assert fit_context(model, tok, turns[:2], "Habari?", 16)[1] == 0
    reply = list(chat_turn(session, "Habari?", turns, "base", max_new_tokens=16))[-1]
    assert reply.dropped == dropped and len(reply.history) == len(turns) + 2
    assert f"{dropped} earlier turn" in reply.note()


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_chat_stops_at_its_deadline(session):
    start = time.monotonic()
    replies = chat_turn(session, "Habari?", [], "base", max_new_tokens=200, deadline=start + 1.0)
    first = next(replies)
    assert not first.stopped
    time.sleep(1.1)                              # the visitor's request is out of time
    last = list(replies)[-1]
    assert last.stopped and "s per request" in last.note()
    assert time.monotonic() - start < 5
    passed = list(chat_turn(session, "Habari?", [], "base", deadline=time.monotonic()))
    assert passed[-1].stopped
    assert passed[-1].history[-1]["content"] == "(no answer: the time ran out)"


def test_banner_follows_the_session(session):
    assert "No models in use" in wb.banner(None)
    wb_build.build(session, swap(session, 2, 1))
    assert "Merged model: built in memory (layer swap: bottom 2, top 1" in wb.banner(session)


# --------------------------------------------------------------------------- cancel, hub, sessions
def test_cancel_stops_the_job_between_steps(session):
    seen = []

    def press_cancel(frac, msg):
        seen.append(msg)
        wb.cancel(session)           # the visitor presses Cancel during the first step

    with pytest.raises(Cancelled):
        evaluate_roles(session, "mgsm", "sw", n=2, shots=0, roles=("task",), max_new_tokens=4,
                       progress=press_cancel)
    assert len(seen) == 1 and readable_error(Cancelled()) == "Cancelled."
    # works again
    evaluate_roles(session, "mgsm", "sw", n=1, shots=0, roles=("task",), max_new_tokens=4)


def test_push_needs_token_and_network(session, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_dummy")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert wb_build.hub_token() is None
    with pytest.raises(WorkbenchError, match="network and a token"):
        wb_build.push_to_hub(session, swap(session, 2, 1), "me/merged")


def test_sessions_do_not_share_merged_models(session, tiny):
    """Two visitors on the same models share one engine, each seeing their own build on it."""
    other, _ = wb_models.open_session(str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    assert other.id != session.id and other.trio == session.trio
    wb_build.build(session, swap(session, 2, 1))
    with pytest.raises(WorkbenchError, match="build the merged model first"):
        other.what("merged")
    wb_build.build(other, swap(other, 0, 0))
    q = "model.layers.0.self_attn.q_proj.weight"
    mine, theirs = merged_state(session)[q], merged_state(other)[q]
    assert torch.equal(mine, _tensor(tiny["lang"], q)) and torch.equal(theirs, _tensor(tiny["task"], q))
    assert len([e for e in wb.dispatcher().pool.engines if e.trio == session.trio]) == 1
    wb.close_session(other)
    assert other.built_config is None and other.id not in wb.dispatcher().visitors


def test_a_session_is_small_plain_data(session):
    import pickle

    wb_build.build(session, swap(session, 2, 1))
    again = pickle.loads(pickle.dumps(session))
    assert again.refs == session.refs and again.built_config == session.built_config
    data = pickle.dumps(session)      # the delta statistics are most of it
    assert b"LiveModel" not in data and b"Lock" not in data and len(data) < 1_000_000


def test_peft_adapter_is_picked_as_a_dense_expert(tiny, tmp_path, monkeypatch):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "cache"))  # the dense copy goes there
    base = AutoModelForCausalLM.from_pretrained(tiny["base"], dtype=torch.float32)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                           init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    expected = lora.merge_and_unload().state_dict()
    session, report = wb_models.open_session(str(tiny["base"]), str(tmp_path / "adapter"),
                                             str(tiny["lang"]))
    assert report.ok and session is not None
    q = "model.layers.3.self_attn.q_proj.weight"
    dense = _tensor(session.paths["task"], q)
    assert torch.equal(dense, expected[q]) and not torch.equal(dense, _tensor(tiny["base"], q))
    with pytest.raises(WorkbenchError, match="give its base model"):
        wb_models.check_models("", str(tmp_path / "adapter"), str(tiny["lang"]))


def test_warm_up_loads_the_one_live_model(session):
    thread = wb.warm_up(session)       # None when the engine is loaded already
    if thread is not None:
        thread.join(timeout=120)
    engines = [e for e in wb.dispatcher().pool.engines if e.trio == session.trio]
    assert len(engines) == 1 and wb.warm_up(session) is None
    with wb.showing(session, "task") as (task, _):
        pass
    with wb.showing(session, "base") as (base, _):
        pass
    assert task is base is engines[0].live.model


def test_every_role_is_the_one_live_model_and_matches_its_checkpoint(session, tiny):
    """base / task / lang / merged are plans over one live model: no second model is loaded,
    its parameter storages never change, and each role's outputs equal that checkpoint loaded
    directly with transformers, token for token."""
    from layerswap_core.checkpoints.loading import load_model

    wb_build.build(session, swap(session, 2, 1))
    (engine,) = [e for e in wb.dispatcher().pool.engines if e.trio == session.trio]
    live = engine.live
    ptrs = [p.data_ptr() for p in live.model.parameters()]
    prompts = ["Juma ana maembe 12.", "What is 2 + 3?"]
    for role in ("base", "task", "lang"):
        direct, _ = load_model(tiny[role])
        with wb.showing(session, role) as (model, tok):
            assert model is live.model
            for text in prompts:
                ids = tok(text, return_tensors="pt")
                assert model.generate(**ids, max_new_tokens=5, do_sample=False).tolist() == \
                    direct.generate(**ids, max_new_tokens=5, do_sample=False).tolist()
    with wb.showing(session, "merged") as (model, _):
        assert model is live.model
    assert [p.data_ptr() for p in live.model.parameters()] == ptrs
    assert [e for e in wb.dispatcher().pool.engines if e.trio == session.trio] == [engine]


def test_side_by_side_evaluation_runs_each_role_on_the_live_model(session, tiny):
    """The four roles evaluated one after another on one live model give the outputs of the
    checkpoints loaded separately (and the merge of a fresh build)."""
    from layerswap_core.evaluation.registry import load_items
    from layerswap_core.evaluation.runner import run_side_by_side
    from layerswap_core.checkpoints.loading import load_model

    wb_build.build(session, swap(session, 2, 1))
    res = evaluate_roles(session, "gsm-symbolic", "sw", 2, 0, False,
                         ("base", "task", "lang", "merged"), 8)
    items = load_items("gsm-symbolic", "sw", 2)
    direct = {wb.ROLE_LABELS[r]: load_model(tiny[r]) for r in ("base", "task", "lang")}
    ref = run_side_by_side(direct, items, shots=0, max_new_tokens=8)
    for got, want in zip(res.raw.rows, ref.rows):
        for label in direct:
            assert got["models"][label]["output"] == want["models"][label]["output"]


@pytest.mark.slow
def test_the_embedded_demo_is_preselected_and_compatible():
    from layerswap_core.checkpoints import embedded as experts
    from layerswap_core.demos import trios
    missing = [r for r in (trios.DEMO_TASK, trios.DEMO_LANG)
               if not (experts.demo_adapter_dir(r) / "adapter_model.safetensors").exists()]
    if missing:
        pytest.skip(f"demo expert adapters not shipped in assets/experts: {missing}")
    assert wb.DEMO_REFS == {"base": trios.DEMO_BASE, "task": trios.DEMO_TASK,
                            "lang": trios.DEMO_LANG}
    report = wb_models.check_models(**wb.DEMO_REFS)
    assert report.ok, report.problems
    assert report.num_layers == 30


def test_spaces_gpu_decorator_is_a_no_op_off_zerogpu():
    from layerswap_core.workbench import spaces

    def work(x):
        return x + 1
    assert spaces.GPU(work) is work and spaces.GPU(duration=30)(work) is work


def test_delta_views_take_a_threshold_per_expert_and_the_papers_matrices(session):
    views = delta_views(session, (1.9e-5, 1.0e-5), matrices_only=True)
    assert views.thresholds == (1.9e-5, 1.0e-5) and session.tau == 1.0e-5
    titles = " ".join(a.text for a in views.heatmaps.layout.annotations)
    assert "1.9e-05" in titles and "1e-05" in titles
    all_kinds = delta_views(session, 1e-4).heatmaps
    assert len(views.heatmaps.data[0].y) < len(all_kinds.data[0].y) or \
        len(views.heatmaps.data[0].x) < len(all_kinds.data[0].x)


def test_evaluation_says_it_is_a_sample(session):
    wb_build.build(session, swap(session, 2, 1))
    res = evaluate_roles(session, "gsm-symbolic", "sw", 2, 0, False, ("merged",), 4)
    note = evaluation_note(res)
    assert "first 2 of 48 items: a sample" in note and "0-shot" in note


def test_chat_examples_follow_the_language_expert():
    """Bengali examples only with a Bengali expert; the demo's Swahili expert gets Swahili ones."""
    from layerswap_core.workbench.chat import chat_examples, language_of
    from layerswap_core.evaluation.languages import LANGUAGES
    CHAT_EXAMPLES = {c: list(row.chat_examples) for c, row in LANGUAGES.items()}

    assert chat_examples(wb.DEMO_REFS["lang"]) == ("Swahili", CHAT_EXAMPLES["sw"])
    assert chat_examples("/models/llama-3-8b-bengali-lora") == ("Bengali", CHAT_EXAMPLES["bn"])
    assert language_of("owner/aya-bn-instruct") == "bn" and language_of("owner/benchmark") is None
    name, examples = chat_examples("/models/telugu-expert")      # no examples for Telugu
    assert name == "Swahili" and not set(examples) & set(CHAT_EXAMPLES["bn"])


def test_swahili_chat_examples_are_validation_variants_never_evaluated():
    """The demo's Swahili chat examples are problems like the evaluated ones: variants of the
    validation seed set (never of the eval set the headline is measured on)."""
    from layerswap_core.demos.variants import variant_items
    from layerswap_core.evaluation.languages import LANGUAGES
    CHAT_EXAMPLES = {c: list(row.chat_examples) for c, row in LANGUAGES.items()}

    examples = set(CHAT_EXAMPLES["sw"])
    assert len(examples) >= 3
    assert examples <= {it.question for it in variant_items("sw", "validation")}
    assert not examples & {it.question for it in variant_items("sw", "eval")}


def test_english_twins_are_the_same_validation_variants_in_english():
    """The English control examples are the Swahili examples' own variants (same id, same gold)
    in English, one for one; so are the Bengali ones (issue #52)."""
    from layerswap_core.demos.variants import variant_items
    from layerswap_core.workbench.chat import english_twins
    from layerswap_core.evaluation.languages import LANGUAGES
    CHAT_EXAMPLES = {c: list(row.chat_examples) for c, row in LANGUAGES.items()}

    sw, en = variant_items("sw", "validation"), variant_items("en", "validation")
    ids = {it.question: it.id for it in sw}
    twins = {it.id: it.question for it in en}
    assert english_twins(wb.DEMO_REFS["lang"]) == [twins[ids[q]] for q in CHAT_EXAMPLES["sw"]]
    bn = variant_items("bn", "validation")
    bn_ids = {it.question: it.id for it in bn}
    assert english_twins("/models/llama-3-8b-bengali-lora") == [twins[bn_ids[q]]
                                                                for q in CHAT_EXAMPLES["bn"]]


# --------------------------------------------------------------------------- coherent controls
def test_controls_the_method_ignores_say_why():
    from layerswap_core.workbench.controls import control_states, ignored_text

    swap_states = control_states("layer swap")
    assert swap_states["bottom"] is None and swap_states["ties_density"] == "not used by layer swap"
    assert swap_states["rules"] == "only for the custom partition"
    soup = control_states("model soup")
    assert soup["bottom"] == "not used by model soup" and soup["w_task"] is None
    assert control_states("TIES")["ties_density"] is None
    assert control_states("TIES")["lambda_task"] == "not used by TIES"
    assert "magnitudes" in control_states("magnitude soup")["w_task"]
    part = control_states("layer swap", "B")
    assert "partition B decides" in part["bottom"] and "partition B" in part["transition_top"]
    assert part["scale_partition"] is None and part["rules"] == "only for the custom partition"
    assert control_states("layer swap", "custom")["rules"] is None
    line = ignored_text(soup, {"bottom", "top", "w_task"})
    assert line == "Not used now: bottom, top (not used by model soup)."


def test_suggestions_outside_the_validated_ranges_are_named():
    from layerswap_core.analysis.suggest import Suggestion
    from layerswap_core.workbench.controls import outside_validated
    from layerswap_core.workbench.deltas import suggestion_text

    assert outside_validated({"bottom": 5, "top": 2, "transition_bottom": 3}, 32) == \
        ["transition bottom 3 (validated: 0, 1, 2)"]
    assert outside_validated({"bottom": 4, "top": 1, "transition_top": 2}, 32) == []
    s = Suggestion(bottom=0, top=0, transition_bottom=3, transition_top=1, partition=None,
                   explanation="")
    text = suggestion_text(s, 32)
    assert "outside the paper's validated ranges" in text and "bottom 0 (validated: 3, 4, 5)" in text


def test_the_configure_tab_says_when_it_changed_since_build(session):
    from layerswap_core.workbench.controls import since_build

    built = swap(session, 2, 1)
    wb_build.build(session, built)
    assert since_build(session.built_config, swap(session, 2, 1), session.num_layers) == ""
    note = since_build(session.built_config, swap(session, 3, 1), session.num_layers)
    assert note.startswith("Changed since build") and "bottom 2, top 1" in note
    assert since_build(None, built, session.num_layers) == ""


def test_a_local_save_with_a_bare_name_goes_to_the_output_folder(session, tmp_path, monkeypatch):
    """Locally too, a name (or relative path) never writes into the current directory (the
    checkout): it lands in the output folder; absolute paths stay as given."""
    cwd, root = tmp_path / "checkout", tmp_path / "outputs"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("LAYERSWAP_OUTPUT_DIR", str(root))
    assert output_folder(Access(), "my-merge") == root / "my-merge"
    assert output_folder(Access(), "sub/m") == root / "sub" / "m"
    assert output_folder(Access(), str(tmp_path / "abs")) == tmp_path / "abs"
    out = wb_build.save(session, swap(session, 2, 1), "bare-merge")
    assert out == root / "bare-merge" and (out / "layerswap.yaml").exists()
    assert list(cwd.iterdir()) == []


def test_one_bad_reference_keeps_the_other_rows(tiny):
    """A bad reference is named; the models that can be read are still described (not shown as
    '(not read)')."""
    with pytest.raises(WorkbenchError) as e:
        wb_models.check_models(str(tiny["base"]), "/no/such/folder", str(tiny["lang"]))
    assert "task expert" in str(e.value) and "language expert" not in str(e.value)
    rows = {r[0]: r for r in e.value.rows}
    assert rows["base"][3] == "8" and rows["language expert"][3] == "8"      # read
    assert rows["task expert"][2].startswith("⚠ cannot be read") and rows["task expert"][3] == ""
    # a long reference and reason are cut in the table (the columns stay on screen); the
    # status line has the whole reason
    typo = "/no/such/" + "x" * 300
    with pytest.raises(WorkbenchError) as e:
        wb_models.check_models(str(tiny["base"]), typo, str(tiny["lang"]))
    cells = {r[0]: r for r in e.value.rows}["task expert"]
    assert all(len(c) <= wb_models.TABLE_CELL_CHARS for c in cells) and cells[1].endswith("…")
    assert typo in str(e.value)
    with pytest.raises(WorkbenchError) as e:                                  # two bad ones
        wb_models.check_models(str(tiny["base"]), "/no/such/a", "/no/such/b")
    assert "task expert" in str(e.value) and "language expert" in str(e.value)


def test_the_embedded_bases_are_offered():
    from layerswap_core.checkpoints.embedded import EMBEDDED_PREFIX, embedded

    assert wb_models.EMBEDDED_BASES[0] == wb.DEMO_REFS["base"]
    assert all(ref[len(EMBEDDED_PREFIX):] in embedded() for ref in wb_models.EMBEDDED_BASES)
    assert "embedded:gemma3-270m" in wb_models.EMBEDDED_BASES


# --------------------------------------------------------------------------- docs/app.md
APP_DOC = __import__("pathlib").Path(__file__).resolve().parents[1] / "docs" / "app.md"


@pytest.mark.slow
def test_the_demo_taus_in_the_docs_are_the_ones_analyze_reports():
    """docs/app.md quotes each demo expert's automatic tau as the Deltas tab reports it."""
    import re

    from layerswap_core.checkpoints import embedded as experts
    from layerswap_core.demos import trios
    if not (experts.demo_adapter_dir(trios.DEMO_LANG) / "adapter_model.safetensors").exists():
        pytest.skip("demo expert adapters not shipped in assets/experts")
    demo, report = wb_models.open_session(**wb.DEMO_REFS)
    assert report.ok, report.problems
    tau_task, tau_lang = delta_views(demo).thresholds
    text = " ".join(APP_DOC.read_text(encoding="utf-8").split())
    quoted = re.search(r"tau (\S+) for the math expert, (\S+) for the Swahili one", text)
    assert quoted and quoted.groups() == (f"{tau_task:.2e}", f"{tau_lang:.2e}"), quoted


def test_the_start_up_line_states_the_bound_never_a_count_that_goes_stale(tiny):
    """The page's top line is written once at start-up: it says how many live models fit, not
    how many are loaded (it said "0 live models loaded" while the process held one)."""
    import re

    from layerswap_core.workbench import spaces

    line = spaces.start({role: str(tiny[role]) for role in ("base", "task", "lang")})
    assert re.fullmatch(r"Jobs run in this process on shared live models: at most \d+ loaded at "
                        r"once \(LAYERSWAP_MAX_ENGINES\); one heavy job per visitor\.", line), line


def test_moving_one_tau_never_nudges_the_other(session):
    """The sliders show log10 tau rounded to their steps; a slider left where Analyze put it
    still means its expert's exact automatic tau when the other slider moves."""
    from layerswap_core.workbench.deltas import slider_taus, slider_value

    tau_task, tau_lang = delta_views(session).thresholds
    assert 10 ** slider_value(tau_task) != tau_task          # the rounded value fed back differs
    assert slider_taus(session, (slider_value(tau_task), -1.0)) == (tau_task, 0.1)
    assert slider_taus(session, (-2.5, slider_value(tau_lang))) == (10 ** -2.5, tau_lang)


def test_the_story_never_puts_the_peak_layer_in_the_wrong_third():
    """The third holding most change and the single most-changed layer can differ (the page said
    "middle third (42%, peak layer 27)" of a 30-layer model): then both are named as they are."""
    import numpy as np

    from layerswap_core.analysis.suggest import delta_story

    class Stats:   # the two things delta_story reads of DeltaStats
        def __init__(self, label, profile):
            self.label, self._p = label, np.asarray(profile, dtype=float)

        def layer_profile(self):
            return self._p

    middle_mass_top_peak = [1] * 10 + [4.2] * 10 + [1] * 9 + [9]
    task, lang = Stats("task expert", middle_mass_top_peak), Stats("language expert", [9] + [1] * 29)
    story = delta_story(task, lang)
    assert "task expert changed most in the middle third (" in story
    assert "single most-changed layer, 29, is in the top third" in story
    assert "language expert changed most in the bottom third" in story
    assert "peak layer 0" in story
