"""Prompts, answer extraction, scoring, gold NLL and side-by-side runs (tiny real models)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from layerswap_core.evaluation import runner as ev
from layerswap_core.evaluation.data import gsm_symbolic_items, load_mgsm
from layerswap_core.evaluation.registry import load_items


pytestmark = pytest.mark.usefixtures("one_thread")



# --------------------------------------------------------------------------- extraction
EXTRACTION_TABLE = [
    # output, lang, cot, strict, flexible
    ("Jibu ni 18.", "sw", True, "18", "18"),
    ("Anabaki na 16 - 3 - 4 = 9 mayai. 9 * $2 = $18. Jibu ni 18.", "sw", True, "18", "18"),
    ("Jibu ni 18. Swali lingine: ana mayai 5", "sw", True, "18", "5"),      # several numbers
    ("Jibu ni 1,000", "sw", True, "1000", "1000"),                           # thousands comma
    ("The answer is ১৮.", "bn", True, "18", "18"),          # lm-eval's Bengali pattern is English
    ("উত্তর হল ১৮", "bn", True, None, "18"),                 # Bengali digits, no strict phrase
    ("సమాధానం ౧౮", "te", True, "18", "18"),                  # Telugu digits
    ("คำตอบคือ ๑,๐๐๐ บาท", "th", True, "1000", "1000"),      # Thai digits and comma
    ("答えは42です。", "ja", True, "42", "42"),
    ("答案是 1,234。", "zh", True, "1234", "1234"),
    ("Die Antwort lautet -5.", "de", True, "-5", "-5"),
    ("Ответ — 7.", "ru", True, "7", "7"),
    ("It costs 3 + 4 = 7 dollars. The answer is 7.0", "en", True, "7", "7"),  # trailing .0
    ("No number in this answer at all.", "en", True, None, None),
    ("I think 12 is right...", "en", True, None, "12"),       # ellipsis does not hide the 12
    (" 18\n\n", "sw", False, "18", "18"),                     # direct: whole output is the answer
    (" 1,000", "sw", False, "1000", "1000"),
    (" 18.0", "en", False, "18", "18"),
    ("$18", "en", False, "18", "18"),
    (" 18 dollars", "en", False, None, "18"),
    (" ১৮", "bn", False, "18", "18"),
    ("", "sw", False, None, None),
]


@pytest.mark.parametrize("output, lang, cot, strict, flexible", EXTRACTION_TABLE)
def test_extraction_table(output, lang, cot, strict, flexible):
    got = ev.extract_answer(output, lang, cot)
    assert (got.strict, got.flexible) == (strict, flexible)


def test_correctness_compares_numbers():
    assert ev.is_correct("18", "18") and ev.is_correct("18.0", "18") and ev.is_correct("1,000", "1000")
    assert not ev.is_correct("18", "17") and not ev.is_correct(None, "18")
    # lm-eval compatible: strings without punctuation, so "18.0" -> "180" is wrong there
    assert ev.is_correct("1,000", "1000", lm_eval_compatible=True)
    assert not ev.is_correct("18.0", "18", lm_eval_compatible=True)


# --------------------------------------------------------------------------- prompts
def test_prompt_format_direct_and_cot():
    items = load_items("mgsm", "sw", 3)
    ex = ev.select_exemplars(ev.exemplar_pool("sw", cot=True), items, 2)
    cot = ev.build_prompt(items[0], ex, cot=True)
    blocks = cot.split("\n\n")
    assert len(blocks) == 3
    assert blocks[0].startswith(f"Swali: {ex[0].question}\nJibu la Hatua kwa Hatua: {ex[0].solution}")
    assert blocks[0].endswith(f"Jibu ni {ex[0].answer}.")
    assert blocks[2] == f"Swali: {items[0].question}\nJibu la Hatua kwa Hatua:"
    direct = ev.build_prompt(items[0], ex, cot=False)
    assert direct.split("\n\n")[0] == f"Swali: {ex[0].question}\nAnswer:{ex[0].answer}"
    assert ev.build_prompt(items[0], [], cot=False) == f"Swali: {items[0].question}\nAnswer:"
    assert ev.answer_phrase("ja", "5") == "答えは5です。" and ev.answer_phrase("sw", "5") == "Jibu ni 5."


def test_chat_template_prompt_has_exemplars_as_turns(tiny_lm):
    _, tok = tiny_lm
    items = load_items("gsm-symbolic", "sw", 1)
    ex = ev.select_exemplars(ev.exemplar_pool("sw", cot=True, source="gsm-symbolic"), items, 2)
    prompt = ev.build_prompt(items[0], ex, cot=True, tokenizer=tok, chat_template=True)
    assert prompt.count("<|im_start|>user") == 3 and prompt.count("<|im_start|>assistant") == 3
    assert prompt.rstrip().endswith("<|im_start|>assistant")
    assert f"Jibu ni {ex[1].answer}." in prompt


@pytest.mark.parametrize("source, lang, n, cot", [
    ("mgsm", "sw", 250, False), ("mgsm", "sw", 20, False), ("mgsm", "bn", 250, True),
    ("gsm-symbolic", "sw", None, True), ("gsm-symbolic", "te", None, False),
    ("gsm-symbolic", "bn", None, True),
])
def test_exemplars_never_overlap_scored_items(source, lang, n, cot):
    items = load_items(source, lang, n)
    ex = ev.select_exemplars(ev.exemplar_pool(lang, cot=cot, source=source), items, 8)
    assert len(ex) == 8 and len({e.id for e in ex}) == 8
    assert not {e.id for e in ex} & {it.id for it in items}
    assert not {e.question for e in ex} & {it.question for it in items}
    assert not {e.origin for e in ex} & {it.origin for it in items}
    if cot:
        assert all(e.solution for e in ex)


def test_exemplars_skip_variants_of_scored_problems():
    # a GSM-Symbolic template derived from a scored MGSM problem is not an exemplar (the
    # training split has none any more: they come from the evaluation templates here)
    train = gsm_symbolic_items("sw", "train")
    assert not [t for t in train if t.origin is not None and t.origin < 250]
    variant = next(t for t in gsm_symbolic_items("sw", "eval") if t.origin is not None and t.origin < 250)
    scored = [load_mgsm("sw")[variant.origin]]
    pool = [variant] + [t for t in train if t.id != variant.id]
    assert ev.select_exemplars(pool, [], 1) == [variant]
    ex = ev.select_exemplars(pool, scored, 8)
    assert variant.id not in {e.id for e in ex} and ex == pool[1:9]
    with pytest.raises(ValueError, match="only 0 exemplars"):
        ev.select_exemplars(train[:1], train[:1], 1)
    with pytest.raises(ValueError, match="between 0 and 8"):
        ev.select_exemplars(train, [], 9)


def _standard_raw(lang):
    from layerswap_core.evaluation.data import MGSM_EXEMPLARS_FILE, find_mgsm_dir
    raw = json.loads((find_mgsm_dir() / MGSM_EXEMPLARS_FILE).read_text(encoding="utf-8"))
    return raw["exemplars"][lang], raw["number_answers"]


@pytest.mark.parametrize("shots", [8, 2])
def test_mgsm_prompts_use_the_standard_exemplars_verbatim_and_in_order(shots):
    exs, numbers = _standard_raw("sw")
    items = load_items("mgsm", "sw", 2)
    chosen = ev.default_exemplars(items, shots, cot=False)
    assert chosen == ev.standard_exemplars("sw", shots) == ev.standard_exemplars("sw", 8)[:shots]
    direct = ev.build_prompt(items[0], chosen).split("\n\n")
    cot = ev.build_prompt(items[0], chosen, cot=True).split("\n\n")
    assert len(direct) == len(cot) == shots + 1
    for i in range(shots):    # lm-eval's direct and native-CoT exemplar formats
        assert direct[i] == f"{exs[i]['q']}\nAnswer:{numbers[i]}"
        assert cot[i] == f"{exs[i]['q']}\n{exs[i]['a']}"    # "Jibu la Hatua kwa Hatua: ... Jibu ni N."
    assert direct[-1] == f"Swali: {items[0].question}\nAnswer:"
    assert cot[-1] == f"Swali: {items[0].question}\nJibu la Hatua kwa Hatua:"


def test_standard_exemplar_targets_keep_lm_evals_slicing():
    # lm-eval's doc_to_target is answer[len(ANSWER) + 1:]; where the exemplar file writes the
    # answer word differently from lm-eval's, the slice is off and we keep it so
    ja = ev.standard_exemplars("ja", 1)[0]
    assert ja.prompt_answer.startswith("ステップごとの答え：")                  # full-width colon
    assert ev.target_text(ja, "ja", True) == ja.prompt_answer[11:]     # one character lost
    ru = ev.standard_exemplars("ru", 1)[0]
    assert ru.prompt_answer.startswith("Пошаговое решение: ")        # lm-eval: "Пошаговоерешение:"
    assert ev.target_text(ru, "ru", True) == ru.prompt_answer[18:]     # starts with the space
    assert ev.target_text(ru, "ru", True).startswith(" ")
    assert ev.target_text(ru, "ru", False) == ru.answer


def test_default_exemplars_by_source_and_refusals(tmp_path):
    sym = load_items("gsm-symbolic", "sw", 3)
    assert ev.default_exemplars(sym, 2, cot=True) == \
        ev.select_exemplars(ev.exemplar_pool("sw", cot=True, source="gsm-symbolic"), sym, 2)
    assert ev.default_exemplars(load_items("mgsm", "sw", 1), 0, cot=False) == []
    with pytest.raises(ValueError, match="between 0 and 8"):
        ev.default_exemplars(load_items("mgsm", "sw", 1), 9, cot=False)
    (tmp_path / "mgsm_sw.tsv").write_text("Swali moja?\t1\n", encoding="utf-8")
    mine = load_mgsm("sw", tmp_path)
    with pytest.raises(ValueError, match="mgsm_exemplars.json"):   # no silent fallback
        ev.default_exemplars(mine, 2, cot=False, data_dir=tmp_path)


# --------------------------------------------------------------------------- statistics
def test_wilson_interval():
    lo, hi = ev.wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = ev.wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert ev.wilson_interval(0, 0) == (0.0, 1.0)
    s = ev.summarize("m", [True, False, True, True], [True, False, False, False], [1.0, math.nan, 3.0])
    assert (s["accuracy"], s["strict_accuracy"], s["n"], s["mean_gold_nll"]) == (0.75, 0.25, 4, 2.0)
    assert s["ci_low"] < 0.75 < s["ci_high"]


# --------------------------------------------------------------------------- gold NLL
def test_gold_nll_matches_direct_computation_and_batching(tiny_lm):
    model, tok = tiny_lm
    prompts = ["Swali: 2 + 3?\nJibu la Hatua kwa Hatua:", "Question: what is 10 - 4?\nStep-by-Step Answer:"]
    targets = [" 2 + 3 = 5. Jibu ni 5.", " 10 - 4 = 6. The answer is 6."]
    batched = ev.gold_nll(model, tok, prompts, targets, batch_size=2)
    single = [ev.gold_nll(model, tok, [p], [t], batch_size=1)[0] for p, t in zip(prompts, targets)]
    assert batched == pytest.approx(single, abs=1e-4)
    p = tok(prompts[0], add_special_tokens=False)["input_ids"]
    t = tok(targets[0], add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = model(torch.tensor([p + t])).logits.float().log_softmax(-1)[0]
    manual = -sum(logp[len(p) - 1 + k, tok_id].item() for k, tok_id in enumerate(t)) / len(t)
    assert batched[0] == pytest.approx(manual, abs=1e-4)


def test_gold_nll_says_how_many_items_are_scored_after_each_pass(tiny_lm):
    """Issue #61: a scoring bar moves per item (per pass), not once per job; the counts do not
    change the values."""
    model, tok = tiny_lm
    shots = "Swali: Juma ana maembe 3 na 4 zaidi.\nJibu: 3 + 4 = 7.\n\n"
    prompts = [shots + f"Swali: {a} + {b}?\nJibu:" for a, b in [(1, 2), (30, 4), (5, 6), (7, 80), (9, 1)]]
    targets = [f" {a} + {b} = {a + b}." for a, b in [(1, 2), (30, 4), (5, 6), (7, 80), (9, 1)]]
    for share in (True, False):
        heard = []
        counted = ev.gold_nll(model, tok, prompts, targets, batch_size=2, share_prefix=share,
                              scored=heard.append)
        assert counted == ev.gold_nll(model, tok, prompts, targets, batch_size=2, share_prefix=share)
        assert heard == sorted(heard) and heard[-1] == len(prompts), heard
        assert len(heard) >= 3 and heard[0] < len(prompts), heard   # 3 batches of at most 2


def test_gold_nll_with_a_shared_few_shot_prefix_matches_direct_computation(tiny_lm):
    model, tok = tiny_lm
    shots = "Swali: Juma ana maembe 3 na ananunua 4 zaidi.\nJibu la Hatua kwa Hatua: 3 + 4 = 7. Jibu ni 7.\n\n"
    qs = ["Bata hutaga mayai 16.", "Ana 5 na anapewa 5?", "Kuna ndege 12 mtini, 3 wanaruka. Wangapi?"]
    prompts = [shots + f"Swali: {q}\nJibu la Hatua kwa Hatua:" for q in qs]
    targets = [" 16 - 3 = 13. Jibu ni 13.", " 5 + 5 = 10. Jibu ni 10.", " 12 - 3 = 9. Jibu ni 9. Ndio."]
    widths = []
    hook = model.register_forward_pre_hook(
        lambda mod, args, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        shared = ev.gold_nll(model, tok, prompts, targets, batch_size=3)
    finally:
        hook.remove()
    enc = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    full = [len(e) + len(tok(t, add_special_tokens=False)["input_ids"]) for e, t in zip(enc, targets)]
    assert widths[0] >= 16 and max(widths[1:]) < max(full)        # prefix once, then the rest
    padded = ev.gold_nll(model, tok, prompts, targets, batch_size=3, share_prefix=False)
    manual = []
    for p, t in zip(prompts, targets):
        p_ids = tok(p, add_special_tokens=False)["input_ids"]
        t_ids = tok(t, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = model(torch.tensor([p_ids + t_ids])).logits.float().log_softmax(-1)[0]
        manual.append(-sum(logp[len(p_ids) - 1 + k, i].item() for k, i in enumerate(t_ids)) / len(t_ids))
    assert shared == pytest.approx(manual, abs=1e-4) and padded == pytest.approx(manual, abs=1e-4)
    assert len({round(x, 3) for x in manual}) == 3


# --------------------------------------------------------------------------- side by side
def test_side_by_side_rows_and_summary(tiny, tiny_lm):
    items = load_items("gsm-symbolic", "sw", 3)
    seen = []
    result = ev.run_side_by_side({"base": tiny_lm, "task": str(tiny["task"])}, items, shots=1,
                                 max_new_tokens=6, batch_size=2,
                                 progress=lambda f, m: seen.append(f))
    assert result.models == ["base", "task"]
    assert [r["id"] for r in result.rows] == [it.id for it in items]
    assert not set(result.config["exemplars"]) & {it.id for it in items}
    for s in result.summary:
        col = [r["models"][s["model"]] for r in result.rows]
        assert s["n"] == 3 and s["accuracy"] == sum(c["correct"] for c in col) / 3
        assert s["ci_low"] <= s["accuracy"] <= s["ci_high"]
        assert s["mean_gold_nll"] == pytest.approx(sum(c["gold_nll"] for c in col) / 3)
        for c, r in zip(col, result.rows):
            assert c["answer"] == ev.extract_flexible(c["output"])
            assert c["correct"] == ev.is_correct(c["answer"], r["gold"])
    # the two models differ (task expert changed its middle layers)
    assert [r["models"]["base"]["output"] for r in result.rows] != \
           [r["models"]["task"]["output"] for r in result.rows]
    assert seen[-1] == pytest.approx(1.0) and seen == sorted(seen)
    assert set(result.flat_rows()[0]) >= {"question", "gold", "base output", "task correct"}
    assert "base" in result.table() and "95% CI" in result.table()
    # the CLI's table and the app's summary show the same cells (accuracy in percent)
    from layerswap_core.workbench.evaluate import _summary_rows
    for line, row in zip(result.table().splitlines()[2:], _summary_rows(result)):
        assert line.split() == " ".join(str(c) for c in row if c != "").split()
        assert row[1].endswith("%")


def test_side_by_side_on_mgsm_uses_the_standard_exemplars(tiny_lm):
    items = load_items("mgsm", "sw", 2)
    res = ev.run_side_by_side({"base": tiny_lm}, items, shots=2, max_new_tokens=2)
    assert res.config["exemplars"] == ["mgsm-sw-exemplar-0", "mgsm-sw-exemplar-1"]
    assert res.config["exemplar_source"] == "MGSM standard exemplars 1-2 of 8"


def test_eval_cli_writes_json(tiny, tmp_path, capsys):
    from layerswap_core.cli import main
    out = tmp_path / "r.json"
    rc = main(["eval", "--model", str(tiny["base"]), "--data", "mgsm", "--lang", "sw", "--n", "2",
               "--shots", "1", "--max-new-tokens", "4", "--device", "cpu", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "MGSM sw: n=2, 1-shot (MGSM standard exemplars 1-1 of 8), direct" in text
    assert "95% CI" in text
    saved = json.loads(out.read_text())
    assert saved["config"]["data"] == "MGSM" and len(saved["rows"]) == 2
    assert saved["summary"][0]["n"] == 2


def test_eval_cli_default_is_every_item_and_bad_n_is_refused(tiny, tmp_path, capsys):
    from layerswap_core.cli import build_parser, main
    assert build_parser().parse_args(["eval", "--model", "m"]).n is None
    out = tmp_path / "all.json"
    assert main(["eval", "--model", str(tiny["base"]), "--shots", "0", "--max-new-tokens", "1",
                 "--batch-size", "64", "--device", "cpu", "--out", str(out)]) == 0
    assert "MGSM sw: n=250, 0-shot" in capsys.readouterr().out
    assert len(json.loads(out.read_text())["rows"]) == 250
    for n in ("0", "-1"):
        assert main(["eval", "--model", str(tiny["base"]), "--n", n]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--n must be at least 1" in err and "Traceback" not in err


def test_eval_cli_missing_exemplars_is_one_line(tiny, tmp_path, capsys):
    from layerswap_core.cli import main
    (tmp_path / "mgsm_sw.tsv").write_text("Swali moja?\t1\n", encoding="utf-8")
    assert main(["eval", "--model", str(tiny["base"]), "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no mgsm_exemplars.json in {tmp_path}" in err


# --------------------------------------------------------------------------- training overlap
def _card(folder, front: str | None):
    folder.mkdir(parents=True, exist_ok=True)
    text = (f"---\n{front}\n---\n" if front else "") + "# a model\n"
    (folder / "README.md").write_text(text, encoding="utf-8")
    return folder


def test_training_overlap_names_the_evaluated_templates_a_card_lists(tmp_path):
    from layerswap_core.evaluation.registry import training_overlap

    mgsm = load_mgsm("sw")[:12]                       # rows 0-11: template 0036 is row 11
    symbolic = gsm_symbolic_items("sw", "eval")[:2]   # templates 0050, 0051
    dirty = _card(tmp_path / "dirty", 'gsm_symbolic_templates: "0030-0040, 0051"')
    clean, line = training_overlap("m", dirty, mgsm)
    assert not clean and "\n" not in line and "1 GSM-Symbolic template(s) that are MGSM items" in line
    assert "0036 = MGSM row 11" in line and "0051" not in line   # row 74 is not evaluated
    clean, line = training_overlap("m", dirty, symbolic)
    assert not clean and line == ("m: its card says it was trained on 1 of the 2 GSM-Symbolic "
                                  "templates evaluated here (0051); its score on them is not a "
                                  "clean test.")
    other = _card(tmp_path / "clean", 'gsm_symbolic_templates: "0000, 0003-0004"')
    assert training_overlap("m", other, symbolic) == (
        True, "m: its card lists the 3 GSM-Symbolic templates it was trained on; none of them is "
              "evaluated here.")
    assert training_overlap("m", _card(tmp_path / "none", None), mgsm) is None
    bad = _card(tmp_path / "bad", "gsm_symbolic_templates: x")
    assert "cannot read" in training_overlap("m", bad, mgsm).text


@pytest.mark.slow
def test_the_cli_and_the_app_say_the_same_about_the_demo_math_experts_templates(capsys):
    """The demo math expert on GSM-Symbolic: ``layerswap eval`` and the Evaluate tab's note make
    one statement, and it is the card's: of templates 0050-0054, 0050 and 0054 were trained on
    (0051-0053 were not)."""
    from layerswap_core.checkpoints.references import resolve
    from layerswap_core.cli import main
    from layerswap_core.evaluation.data import card_templates
    from layerswap_core.workbench import session as wb
    from layerswap_core.workbench import models as wb_models
    from layerswap_core.workbench.evaluate import evaluate_roles, evaluation_note

    task = wb.DEMO_REFS["task"]
    trained = card_templates(resolve(task))
    items = gsm_symbolic_items("sw", "eval")[:5]
    numbers = [int(it.id[-4:]) for it in items]
    hit = [f"{t:04d}" for t in numbers if t in trained]
    assert numbers == [50, 51, 52, 53, 54] and hit == ["0050", "0054"]
    said = ("its card says it was trained on 2 of the 5 GSM-Symbolic templates evaluated here "
            "(0050, 0054); its score on them is not a clean test.")

    assert main(["eval", "--model", task, "--data", "gsm-symbolic", "--lang", "sw", "--n", "5",
                 "--shots", "0", "--max-new-tokens", "1", "--device", "cpu"]) == 0
    cli = [line for line in capsys.readouterr().err.splitlines() if "card" in line]
    assert cli == [f"warning: {task}: {said}"]

    session, report = wb_models.open_session(**wb.DEMO_REFS)
    assert report.ok, report.problems
    res = evaluate_roles(session, "gsm-symbolic", "sw", 5, 0, False, ("task",), 8)
    app = [line for line in evaluation_note(res).splitlines() if "card" in line]
    assert app == [f"⚠ task expert: {said}"]
    wb.close_session(session)


def test_eval_cli_warns_about_a_model_trained_on_mgsm_items(tiny, tmp_path, capsys):
    from layerswap_core.cli import main
    model = tmp_path / "expert"
    model.mkdir()
    for f in tiny["base"].iterdir():
        (model / f.name).symlink_to(f)
    _card(model, "gsm_symbolic_templates: [36]")
    assert main(["eval", "--model", str(model), "--n", "12", "--shots", "0",
                 "--max-new-tokens", "1", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "0036 = MGSM row 11" in err


def test_one_chat_renderer_for_chat_the_demo_and_the_trainer(tiny_lm):
    """Chat, the demo's task and the trainer render through ``prompts.render_chat``: the chat
    template where there is one; without one, the trainer's plain lines (one fallback), which
    chat stops at the next user line."""
    import copy

    from layerswap_core.demos.measure import demo_task
    from layerswap_core.inference.chat import chat_prompt
    from layerswap_core.inference.prompts import chat_stop, render_chat
    from layerswap_core.training.sft_data import IGNORE, encode_example

    model, tok = tiny_lm
    items = gsm_symbolic_items("en", "eval")[:2]
    task = demo_task(items)
    assert tok.chat_template and task.prompts(tok) == [
        tok.apply_chat_template([{"role": "user", "content": it.question}], tokenize=False,
                                add_generation_prompt=True) for it in items]
    plain = copy.deepcopy(tok)
    plain.chat_template = None
    assert render_chat(plain, "2+3?") == "user: 2+3?\nassistant: " == chat_prompt(plain, "2+3?")
    assert task.prompt(items[0], plain) == f"user: {items[0].question}\nassistant: "
    assert chat_stop(plain) == ("\nuser:",) and chat_stop(tok) == ()
    ids, labels = encode_example(plain, {"messages": [{"role": "user", "content": "2+3?"},
                                                      {"role": "assistant", "content": "5"}]}, 64)
    prompt = [i for i, lab in zip(ids, labels) if lab == IGNORE]
    assert plain.decode(prompt).endswith(render_chat(plain, "2+3?"))
    assert plain.decode([i for i in labels if i != IGNORE]) == "5\n" + plain.eos_token
    assert task.extract("so 2+3=5 #### 5").flexible == "5" and task.correct("5", "5")


NESTED_LOOPS = ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
                "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_a_chat_template_of_nested_loops_is_refused_within_seconds(tiny):
    from bounded import assert_refused, run_attack

    setup = f"""
        from transformers import AutoTokenizer
        from layerswap_core.inference.prompts import render_chat
        tok = AutoTokenizer.from_pretrained({str(tiny['task'])!r})
        tok.chat_template = {NESTED_LOOPS!r}
    """
    assert_refused(run_attack(setup, "render_chat(tok, 'hi')"), "chat template runs past")


# each a chat template's way to take hours or gigabytes, and the bound that refuses it
TEMPLATE_BATTERY = {
    "{{ ('a' * 1000000000)|length }}": "a product",
    "{{ ([1] * 100000) * 100000 }}": "a product",
    "{{ 7 ** 999999999 }}": "a power",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}": "too deeply",
    "{% for i in range(100000) %}{{ range(100000)|join(',') }}{% endfor %}": "writes over",
    "{{ range(100000)|map('string')|join('x' * 900000) }}": "a joined string",
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}":
        "runs past",
    "{% set ns = namespace(a=['x' * 1000]) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a]"
    " %}{% endfor %}{{ ns.a|tojson }}": "a value",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s|length }}": "a value",
    "{{ '%999999999d' % 1 }}": "field width",
    "{{ '{:>999999999}'.format(1) }}": "field width",
    "{{ ('{0}' * 300000).format('y' * 900000) }}": "a formatted string",
    "{{ ('a' * 100000)|replace('a', 'b' * 100000) }}": "a replaced string",
    "{{ ('a' * 100000).replace('a', 'b' * 100000) }}": "a replaced string",
    "{{ ('\n' * 500000)|indent(1000) }}": "an indented string",
    "{{ 'x'|center(1000000000) }}": "passes the number",
    "{{ ('\t' * 500000).expandtabs(1000) }}": "an expanded string",
}


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_a_battery_of_hostile_chat_templates_is_refused_in_one_line_each(tiny):
    """Loops, recursion, products, powers, joins, formats and doublings: every one refused in
    one line naming its bound, all of them together within seconds and 100 MB."""
    from bounded import assert_bounded, run_attack

    setup = f"""
        from transformers import AutoTokenizer
        from layerswap_core.inference.prompts import ChatTemplateError, render_chat
        tok = AutoTokenizer.from_pretrained({str(tiny['task'])!r})
        def refusal(template):
            tok.chat_template = template
            try:
                return "rendered " + render_chat(tok, "hi")[:80]
            except ChatTemplateError as e:
                return str(e)
        battery = {list(TEMPLATE_BATTERY)!r}
    """
    r = run_attack(setup, "[refusal(t) for t in battery]")
    assert_bounded(r)
    answers = eval(r.message)   # noqa: S307 - the repr of a list of strings, from our child
    for (template, words), answer in zip(TEMPLATE_BATTERY.items(), answers):
        assert answer.startswith("the chat template ") and answer.endswith(": refused"), answer
        assert words in answer and "\n" not in answer, (template, answer)
    # values made and dropped in a loop are freed as it goes (the bounds keep none of them)
    setup += "\n        tok.chat_template = " + repr(
        "{% for i in range(100000) %}{% set x = [('x' * 100000) ~ i] %}{% endfor %}done")
    assert_bounded(run_attack(setup, "render_chat(tok, 'hi')"))
