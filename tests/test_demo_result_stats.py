"""The demo result (issue #29): the graded per-item measure, its statistics, and the shipped
file (every statistic recomputed from its per-item values; the Reproduce path on the shipped
experts gives the shipped per-item values)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from layerswap_core.evaluation import demo_result as D

ROOT = Path(__file__).resolve().parents[1]


def test_sign_test_t_test_and_bootstrap_by_hand():
    # sign test: 7 lower, 2 higher, 1 tie (ties dropped)
    a = [1.0] * 7 + [3.0] * 2 + [2.0]
    b = [2.0] * 10
    s = D.paired_stats(a, b, resamples=2000, seed=3)
    assert (s["lower"], s["higher"], s["n"]) == (7, 2, 10)
    assert s["sign_p"] == pytest.approx(2 * sum(math.comb(9, k) for k in range(3)) / 2 ** 9)
    d = np.array(a) - np.array(b)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    assert s["mean_difference"] == pytest.approx(d.mean()) and s["t"] == pytest.approx(t)
    # Student t two-sided p at known quantiles: t_{0.975, 9} = 2.262157, t_{0.995, 30} = 2.749996
    assert D.student_t_p(2.262157, 9) == pytest.approx(0.05, abs=1e-6)
    assert D.student_t_p(-2.749996, 30) == pytest.approx(0.01, abs=1e-6)
    assert D.student_t_p(0.0, 5) == pytest.approx(1.0)
    # the bootstrap: seeded (same interval twice), around the mean, narrower with more items
    lo, hi = D.bootstrap_ci(d, seed=1)
    assert lo < d.mean() < hi
    wide = np.random.default_rng(0).normal(0.5, 1.0, 20)
    assert D.bootstrap_ci(wide, seed=1) == D.bootstrap_ci(wide, seed=1) != \
        D.bootstrap_ci(wide, seed=2)
    narrow = np.random.default_rng(0).normal(0.5, 1.0, 2000)
    w, n = D.bootstrap_ci(wide), D.bootstrap_ci(narrow)
    assert n[1] - n[0] < (w[1] - w[0]) / 4 and n[0] < 0.5 < n[1]


def test_reading_nll_is_the_runner_gold_nll_and_its_answer_tokens(tiny_lm):
    """The batched measure (left-padded, logits for the target only) equals the runner's gold
    NLL item by item; the answer part is the NLL of exactly the answer's last tokens."""
    import torch

    from layerswap_core.checkpoints.tokenizers import encode_continuation, encode_prompt
    from layerswap_core.evaluation.prompts import render_chat
    from layerswap_core.evaluation.runner import gold_nll
    from layerswap_core.evaluation.tasks import token_nll
    from layerswap_core.evaluation.variants import variant_items

    model, tok = tiny_lm
    sw, en = variant_items("sw", "eval")[:6], variant_items("en", "eval")[:6]
    prompts = [render_chat(tok, it.question) for it in sw]
    targets = [D.reading_target(it) for it in en]
    got = D.reading_nll(model, tok, prompts, targets, [it.answer for it in en],
                        token_budget=900)   # several batches of different widths
    assert [g[0] for g in got] == pytest.approx(gold_nll(model, tok, prompts, targets), abs=1e-5)
    p, t = encode_prompt(tok, prompts[0]), encode_continuation(tok, targets[0])
    k = D.answer_tokens(tok, t, en[0].answer)
    assert en[0].answer in tok.decode(t[-k:]) and en[0].answer not in tok.decode(t[-k + 1:])
    with torch.inference_mode():
        logits = model(torch.tensor([p + t])).logits[0]
    pred = logits[len(p) - 1:len(p) + len(t) - 1]
    assert got[0][1] == pytest.approx(float(token_nll(pred[-k:], torch.tensor(t[-k:]))) / k,
                                      abs=1e-5)


def test_the_demo_result_runs_end_to_end_on_a_tiny_trio(tiny):
    """The bench's code path on tiny models: every model on the same paired items, both
    questions, the swap chosen on validation, the controls present, statistics from the items."""
    from layerswap_core.workbench.demo import (BEST, DEFAULT, REVERTED, add_accuracy,
                                               reproduce_demo_result)

    refs = {k: str(tiny[k]) for k in ("base", "task", "lang")}
    res = reproduce_demo_result(refs, n=3, n_validation=2, max_new_tokens=2, resamples=500)
    assert res["accuracy"] is None and not any("accuracy" in it for it in res["items"])
    before = [dict(it["nll"]["sw"]) for it in res["items"]]
    res = add_accuracy(res, refs, 2, max_new_tokens=2)   # the bench's --add-accuracy
    assert [it["nll"]["sw"] for it in res["items"]] == before
    assert set(res["models"]) == {"base", "math expert", "language expert", DEFAULT, BEST,
                                  "uniform soup", DEFAULT + REVERTED, BEST + REVERTED}
    assert len(res["items"]) == 3 and res["n_validation"] == 2
    for it in res["items"]:
        assert set(it["nll"]) == {"sw", "en"}
        assert set(it["nll"]["sw"]) == set(res["models"])   # control (b): Swahili only
        assert set(it["nll"]["en"]) == {m for m in res["models"] if REVERTED not in m}
        for q in ("sw", "en"):
            assert all(v > 0 and len(pair) == 2 for pair in it["nll"][q].values() for v in pair)
        assert it["id"] == f"variant-eval-{it['template']:04d}-{it['variant']}"
    # the control changes the model: base outer layers are not the language expert's
    assert any(it["nll"]["sw"][DEFAULT + REVERTED] != it["nll"]["sw"][DEFAULT]
               for it in res["items"])
    assert (res["best"]["bottom"], res["best"]["top"]) in {(r["bottom"], r["top"])
                                                          for r in res["sweep"]}
    assert res["accuracy"]["n"] == 2 and len(res["accuracy"]["summaries"]) == 2 * 6
    assert sum("accuracy" in it for it in res["items"]) == 2
    for s in res["accuracy"]["summaries"]:
        marks = [it["accuracy"][s["lang"]][s["model"]] for it in res["items"] if "accuracy" in it]
        assert s["correct"] == sum(m["correct"] for m in marks) and all(
            isinstance(m["output"], str) for m in marks)
    assert "| layer swap (default) |" in res["markdown"] and "sign p" in res["markdown"]
    assert isinstance(res["suggestion"]["bottom"], int)


def _recomputed_pairs(res: dict):
    """Every paired row of a result, recomputed from the per-item values by hand."""
    for r in res["paired"]:
        col = 0 if r["target"] == "solution" else 1
        a = np.array([it["nll"][r["question"]][r["model"]][col] for it in res["items"]])
        b = np.array([it["nll"][r["question"]][r["vs"]][col] for it in res["items"]])
        yield r, a - b


def test_the_shipped_result_recomputes_from_its_items_and_is_the_docs_table():
    from layerswap_core.workbench.demo import best_of, measured_demo_result

    res = measured_demo_result()
    assert res is not None, "assets/experts/demo_result.json (version 2) is shipped"
    assert res["n"] == len(res["items"]) >= 16
    rows = list(_recomputed_pairs(res))
    measured = {(q, m) for q in res["questions"] for m in res["items"][0]["nll"][q]}
    assert len(rows) == 2 * sum((q, a) in measured and (q, b) in measured
                                for q in res["questions"] for a, b in res["comparisons"])
    for r, d in rows:
        assert r["n"] == len(d)
        assert (r["lower"], r["higher"]) == (int((d < 0).sum()), int((d > 0).sum()))
        assert r["mean_difference"] == pytest.approx(d.mean(), abs=1e-12)
        k, m = min(r["lower"], r["higher"]), r["lower"] + r["higher"]
        assert r["sign_p"] == pytest.approx(min(1.0, 2 * sum(math.comb(m, i) for i in
                                                              range(k + 1)) / 2 ** m))
        if d.std(ddof=1) > 0:
            assert r["t"] == pytest.approx(d.mean() / (d.std(ddof=1) / math.sqrt(len(d))))
        else:   # identical models (control b against the math expert): no t
            assert r["t"] is None and r["t_p"] is None
        assert (r["ci_low"], r["ci_high"]) == pytest.approx(
            D.bootstrap_ci(d, resamples=res["resamples"], seed=res["seed"]))
        assert r["ci_low"] <= r["mean_difference"] <= r["ci_high"]
    for m in res["means"]:
        v = [it["nll"][m["question"]][m["model"]][D.TARGETS.index(m["target"])]
             for it in res["items"]]
        assert m["mean"] == pytest.approx(np.mean(v), abs=1e-12)
    again = D.summarize(res["items"], res["comparisons"], list(res["questions"]),
                        resamples=res["resamples"], seed=res["seed"])
    assert again["paired"] == res["paired"] and again["means"] == res["means"]
    assert res["best"] == {k: best_of(res["sweep"])[k] for k in ("bottom", "top")}
    # every accuracy figure from the stored per-item correctness
    acc = res.get("accuracy")
    if acc:
        for s in acc["summaries"]:
            marks = [it["accuracy"][s["lang"]][s["model"]]["correct"]
                     for it in res["items"] if "accuracy" in it]
            assert (s["n"], s["correct"]) == (len(marks), sum(marks))
    docs = (ROOT / "docs" / "demo.md").read_text()
    assert res["markdown"] in docs


def test_the_shipped_items_are_held_out_eval_variants_spread_over_the_templates():
    from layerswap_core.evaluation.variants import SPLIT_SEEDS, variant_items
    from layerswap_core.workbench.demo import measured_demo_result, spread

    res = measured_demo_result()
    ev = spread(variant_items("en", "eval"), res["n"])
    assert [it["id"] for it in res["items"]] == [it.id for it in ev]
    assert [it["gold"] for it in res["items"]] == [it.answer for it in ev]
    assert all(it["seed"] == SPLIT_SEEDS["eval"] + it["template"] for it in res["items"])


@pytest.mark.slow
def test_the_reproduce_path_gives_the_shipped_values(one_thread):
    """The Reproduce button's job on the shipped experts, 2 items: the per-item NLLs of every
    model the sweep does not choose are the shipped ones."""
    from layerswap_core.training.demo_experts import DEMO_BASE, DEMO_LANG, DEMO_TASK
    from layerswap_core.workbench.demo import (BEST, DEFAULT, REVERTED, measured_demo_result,
                                               reproduce_demo_result)

    shipped = {it["id"]: it for it in measured_demo_result()["items"]}
    res = reproduce_demo_result({"base": DEMO_BASE, "task": DEMO_TASK, "lang": DEMO_LANG},
                                n=2, n_validation=1, resamples=200)
    assert len(res["items"]) == 2
    # the math expert's outer layers are the base's (partial training), so the default swap
    # with the base's outer layers has the math expert's weights: measured once, copied
    assert res["same_weights"].get(DEFAULT + REVERTED) == "math expert", res["same_weights"]
    for it in res["items"]:
        assert it["nll"]["sw"][DEFAULT + REVERTED] == it["nll"]["sw"]["math expert"]
    for it in res["items"]:
        assert it["id"] in shipped
        for q, row in it["nll"].items():
            for model, values in row.items():
                if not model.startswith(BEST):
                    assert values == pytest.approx(shipped[it["id"]]["nll"][q][model],
                                                   abs=2e-3), (q, model)


def test_the_readme_states_the_shipped_headline():
    """README.md's demo lines carry the shipped headline figure (the default swap minus the math
    expert after the Swahili question) and its n, as the bench computed them."""
    from layerswap_core.workbench.demo import DEFAULT, measured_demo_result

    res = measured_demo_result()
    (row,) = [r for r in res["paired"] if (r["model"], r["vs"], r["question"], r["target"])
              == (DEFAULT, "math expert", "sw", "solution")]
    readme = (ROOT / "README.md").read_text()
    line = readme[readme.index("**What the demo shows"):].split("\n\n", 1)[0]
    assert f"{row['mean_difference']:+.3f} nats/token" in line
    assert f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]" in line and f"n = {res['n']}" in line


def test_the_reading_chart_draws_each_difference_with_its_interval():
    from layerswap_core.workbench.figures import reading_chart

    rng = np.random.default_rng(5)
    models = ["math expert", "swap", "swap, base outer"]
    items = [{"nll": {"sw": {m: list(rng.normal(2 + i, 0.1, 2)) for i, m in enumerate(models)},
                      "en": {m: list(rng.normal(1 + i, 0.1, 2)) for i, m in enumerate(models[:2])}}}
             for _ in range(30)]
    rows = D.summarize(items, [("swap", "math expert"), ("swap, base outer", "math expert")],
                       ["sw", "en"], resamples=500)["paired"]
    fig = reading_chart(rows, "math expert", models[1:], {"sw": "Swahili q", "en": "English q"})
    sw, en = fig.data
    assert (sw.name, list(sw.x), list(en.x)) == ("Swahili q", models[1:], ["swap"])
    r = next(r for r in rows if (r["model"], r["question"], r["target"]) == ("swap", "sw",
                                                                              "solution"))
    assert sw.y[0] == pytest.approx(r["mean_difference"]) and 0.9 < sw.y[0] < 1.1
    assert sw.y[0] + sw.error_y.array[0] == pytest.approx(r["ci_high"])
    assert sw.y[0] - sw.error_y.arrayminus[0] == pytest.approx(r["ci_low"])


def test_equal_weights_have_equal_fingerprints_and_any_change_shows(tiny, one_thread):
    """``weights_fingerprint`` of the live model: showing the same model twice gives the same
    digest (so the demo measures it once); another model, or one element changed, does not."""
    import torch

    from layerswap_core.merge.live import LiveModel
    from layerswap_core.workbench.demo import weights_fingerprint

    live = LiveModel.from_refs(str(tiny["task"]), str(tiny["lang"]), str(tiny["base"]))
    live.show("task")
    first = weights_fingerprint(live.model)
    live.show("lang")
    other = weights_fingerprint(live.model)
    live.show("task")
    assert weights_fingerprint(live.model) == first != other
    with torch.no_grad():
        p = next(live.model.parameters())
        p.view(-1)[0] += 1e-3
    assert weights_fingerprint(live.model) != first


def test_the_page_chart_draws_the_merges_of_the_shipped_result_against_the_math_expert():
    """The Reproduce accordion's chart of the shipped result: one bar per merge and control
    (base and language expert, far off, stay in the tables), at the stored paired differences."""
    from layerswap_core.workbench.demo import BEST, measured_demo_result, result_chart

    res = measured_demo_result()
    sw, en = result_chart(res).data
    assert "base" not in sw.x and "language expert" not in sw.x and BEST in sw.x
    assert len(sw.x) == len(res["models"]) - 3 and len(en.x) == 3   # controls (b): sw only
    row = next(r for r in res["paired"] if (r["model"], r["vs"], r["question"], r["target"])
               == (BEST, "math expert", "sw", "solution"))
    assert sw.y[list(sw.x).index(BEST)] == pytest.approx(row["mean_difference"])


def test_accuracy_scores_a_model_with_repeated_weights_once(tiny, one_thread):
    """``run_accuracy`` with ``same_weights``: the chosen swap, bit-equal to the default one, is
    copied (never shown or decoded again); every other model is shown once per language."""
    from layerswap_core.evaluation.variants import variant_items
    from layerswap_core.merge.config import MergeConfig
    from layerswap_core.merge.live import LiveModel
    from layerswap_core.workbench.demo import (BEST, DEFAULT, QUESTIONS, _item_record,
                                               model_shows, run_accuracy)

    refs = {r: str(tiny[r]) for r in ("task", "lang")}
    live = LiveModel.from_refs(refs["task"], refs["lang"])
    swap = MergeConfig(bottom=2, top=1, **refs)
    shows = model_shows(dict(refs, base=None), swap, swap)
    assert "base" not in shows and BEST in shows
    ev = {q: variant_items(q, "eval")[:2] for q in QUESTIONS}
    records = [_item_record(it) for it in ev["en"]]
    shown = []
    show = live.show
    live.show = lambda what, *a, **k: (shown.append(what), show(what, *a, **k))[1]
    acc = run_accuracy(live, shows, ev, records, 2, 2, same_weights={BEST: DEFAULT})
    assert len(shown) == len(QUESTIONS) * (len(shows) - 1)
    for r in records:
        for q in QUESTIONS:
            assert r["accuracy"][q][BEST] == r["accuracy"][q][DEFAULT]
    assert {s["model"] for s in acc["summaries"]} == set(shows)
