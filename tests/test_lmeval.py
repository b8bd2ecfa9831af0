"""Our prompts and scorer agree with lm-eval's installed mgsm tasks (filters, metric, prompts)."""
from __future__ import annotations

import pytest

from layerswap_core.evaluation import runner as ev
from layerswap_core.evaluation import mgsm_task
from layerswap_core.evaluation.data import MGSM_LANGS
from layerswap_core.evaluation.registry import load_items
from layerswap_core.evaluation.lmeval import installed_task_yaml, mgsm_task_config, run_lm_eval
from layerswap_core.checkpoints.loading import load_model


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("lang", MGSM_LANGS)
def test_prompt_words_match_installed_yaml(lang):
    w = mgsm_task.PROMPT_WORDS[lang]
    direct, cot = installed_task_yaml(lang, False), installed_task_yaml(lang, True)
    assert f'"{w.question} "+question+"\\n{w.direct_answer}"' in direct["doc_to_text"]
    assert f'"{w.question} "+question+"\\n{w.cot_answer}"' in cot["doc_to_text"]
    strict = next(f for f in cot["filter_list"] if f["name"] == "strict-match")
    assert strict["filter"][0]["regex_pattern"] == w.answer_regex
    flexible = next(f for f in cot["filter_list"] if f["name"] == "flexible-extract")
    assert flexible["filter"][0]["regex_pattern"] == ev.FLEXIBLE_REGEX
    assert cot["generation_kwargs"]["until"] == ev.stop_strings(lang)
    assert direct.get("target_delimiter", " ") == ev.target_delimiter(lang, False)
    assert cot.get("target_delimiter", " ") == ev.target_delimiter(lang, True)


def test_prompt_words_are_read_for_every_installed_language_with_an_english_fallback():

    assert tuple(mgsm_task.PROMPT_WORDS) == mgsm_task.languages() and set(MGSM_LANGS) <= set(mgsm_task.PROMPT_WORDS)
    assert ev.prompt_words("swh") == mgsm_task.PROMPT_WORDS["sw"] and ev.prompt_words("yor") == mgsm_task.PROMPT_WORDS["en"]
    assert ev.stop_strings("yor") == ev.stop_strings("en")
    # lm-eval's RegexFilter finds nothing: None, not its "[invalid]" placeholder
    assert mgsm_task.apply_filter("no number", "sw", True, "strict-match") is None
    assert mgsm_task.apply_filter("Jibu ni 7.", "sw", True, "strict-match") == "7."


def _lm_eval_scores(lang: str, cot: bool, outputs: list[str], gold: str) -> dict[str, list[bool]]:
    """lm-eval's own filters (from the installed YAML) and exact_match on raw outputs."""
    from lm_eval.api.metrics import exact_match_hf_evaluate
    import lm_eval.filters  # noqa: F401 - registers the filters
    from lm_eval.api.registry import get_filter

    scores = {}
    for ensemble in installed_task_yaml(lang, cot)["filter_list"]:
        resps = [[o] for o in outputs]
        for step in ensemble["filter"]:
            kwargs = {k: v for k, v in step.items() if k != "function"}
            resps = list(get_filter(step["function"])(**kwargs).apply(resps, [None] * len(outputs)))
        scores[ensemble["name"]] = [
            bool(exact_match_hf_evaluate([r], [gold], ignore_case=True,
                                         ignore_punctuation=True)["exact_match"])
            for r in resps]
    return scores


# Real-looking outputs; the ones marked True hold what our normalisation reads differently on
# purpose (native digits, "18.0", a number hidden by a trailing ellipsis, decimal commas,
# minus signs, which lm-eval's punctuation stripping throws away).
AGREEMENT_OUTPUTS = [
    (" 18", False), (" 18.", False), ("18\n\n", False), (" $18", False), (" 1,800", False),
    (" 17", False), (" 18 dollars", False), ("Jibu ni 18.", False), ("Jibu ni 18. Kisha 20", False),
    ("9 * 2 = 18. Jibu ni 18.", False), ("The answer is 18.", False), ("no number", False),
    ("Jibu ni 1,800", False), ("", False), ("Jibu ni -18", True),   # lm-eval drops the "-"
    (" 18.0", True), ("Jibu ni ১৮", True), ("Jibu ni 18 ...", True),
    (" 1,8", True),     # a decimal comma to us (1.8), "18" once lm-eval drops punctuation
]


@pytest.mark.parametrize("lang, cot", [("sw", False), ("sw", True), ("en", True), ("bn", True)])
def test_scorer_agrees_with_lm_eval_filters(lang, cot):
    outputs = [o for o, _ in AGREEMENT_OUTPUTS]
    theirs = _lm_eval_scores(lang, cot, outputs, "18")
    strict_name = "strict-match" if cot else "remove_whitespace"
    for i, (out, ours_differs) in enumerate(AGREEMENT_OUTPUTS):
        compat = ev.extract_answer(out, lang, cot, lm_eval_compatible=True)
        assert ev.is_correct(compat.strict, "18", lm_eval_compatible=True) == theirs[strict_name][i], out
        assert ev.is_correct(compat.flexible, "18", lm_eval_compatible=True) == \
            theirs["flexible-extract"][i], out
        ours = ev.extract_answer(out, lang, cot)
        if not ours_differs:
            assert ev.is_correct(ours.strict, "18") == theirs[strict_name][i], out
            assert ev.is_correct(ours.flexible, "18") == theirs["flexible-extract"][i], out
    # where we differ, we are right and lm-eval is not
    assert ev.is_correct(ev.extract_flexible(" 18.0"), "18") and not theirs["flexible-extract"][15]


def _standard_raw(lang):
    import json

    from layerswap_core.evaluation.data import MGSM_EXEMPLARS_FILE, find_mgsm_dir
    raw = json.loads((find_mgsm_dir() / MGSM_EXEMPLARS_FILE).read_text(encoding="utf-8"))
    return raw["exemplars"][lang], raw["number_answers"]


def _in_order(prompt: str, pieces: list[str]) -> bool:
    at = 0
    for piece in pieces:
        at = prompt.find(piece, at)
        if at < 0:
            return False
        at += len(piece)
    return True


@pytest.mark.parametrize("lang", MGSM_LANGS)
def test_lm_evals_prompts_are_ours_with_the_standard_exemplars(lang):
    """lm-eval's own task (installed YAML, fewshot_context) and build_prompt give the same text,
    and the benchmark's exemplars appear in it verbatim and in order (8-shot, direct and CoT)."""
    from lm_eval.api.task import ConfigurableTask

    exs, numbers = _standard_raw(lang)
    items = load_items("mgsm", lang, 2)
    for cot in (False, True):
        exemplars = ev.default_exemplars(items, 8, cot=cot)
        task = ConfigurableTask(config=mgsm_task_config(lang, items, exemplars, cot=cot))
        for doc, item in zip(task.test_docs(), items):
            theirs = task.fewshot_context(doc, 8)
            assert theirs == ev.build_prompt(item, exemplars, cot=cot)
            assert theirs.count("\n\n") == 8
            assert _in_order(theirs, [e["q"] for e in exs])
            w = ev.prompt_words(lang)
            targets = [e["a"][len(w.cot_answer) + 1:] for e in exs] if cot \
                else [f"{w.direct_answer}{n}" for n in numbers]
            assert _in_order(theirs, targets)


@pytest.mark.parametrize("cot", [False, True])
def test_simple_evaluate_on_in_memory_model_matches_our_run(tiny, cot):
    model, tok = load_model(tiny["base"])
    items = load_items("mgsm", "sw", 3)
    out = run_lm_eval(model, tok, "sw", items=items, shots=2, cot=cot, max_gen_toks=6)
    exemplars = ev.standard_exemplars("sw", 2)      # the default: MGSM's own, first 2 in order
    assert out["exemplars"] == [e.id for e in exemplars]
    name = "mgsm_native_cot_sw_local" if cot else "mgsm_direct_sw_local"
    assert out["task"] == name and out["metrics"]["sample_len"] == 3
    strict_name = "strict-match" if cot else "remove_whitespace"
    samples = out["samples"]
    assert {s["filter"] for s in samples} == {strict_name, "flexible-extract"}
    ours = ev.run_side_by_side({"base": (model, tok)}, items, shots=2, cot=cot, max_new_tokens=6,
                               with_nll=False)
    exs, _ = _standard_raw("sw")
    for s in samples:
        item = items[s["doc_id"]]
        prompt = s["arguments"]["gen_args_0"]["arg_0"] if isinstance(s["arguments"], dict) \
            else s["arguments"][0][0]
        assert prompt == ev.build_prompt(item, exemplars, cot=cot)   # same prompt, from local data
        assert prompt.startswith(f"{exs[0]['q']}\n") and f"\n\n{exs[1]['q']}\n" in prompt
        raw = s["resps"][0][0]
        row = ours.rows[s["doc_id"]]["models"]["base"]
        assert raw == row["output"]                                # same greedy output
        ex = ev.extract_answer(raw, "sw", cot, lm_eval_compatible=True)
        mine = ex.strict if s["filter"] == strict_name else ex.flexible
        assert ev.is_correct(mine, item.answer, lm_eval_compatible=True) == bool(s["exact_match"])
        assert s["target"] == item.answer
    flexible = [s for s in samples if s["filter"] == "flexible-extract"]
    assert out["metrics"]["exact_match,flexible-extract"] == \
        pytest.approx(sum(s["exact_match"] for s in flexible) / len(flexible))


def test_eval_cli_lm_eval_mode(tiny, tmp_path, capsys):
    import json

    from layerswap_core.cli import main
    out = tmp_path / "lm.json"
    rc = main(["eval", "--lm-eval", "--model", str(tiny["base"]), "--lang", "sw", "--n", "2",
               "--shots", "1", "--max-new-tokens", "4", "--device", "cpu", "--out", str(out)])
    assert rc == 0
    assert "lm-eval mgsm_direct_sw_local (n=2, 1-shot): remove_whitespace" in capsys.readouterr().out
    saved = json.loads(out.read_text())[str(tiny["base"])]
    assert set(saved["metrics"]) == {"exact_match,remove_whitespace", "exact_match,flexible-extract"}
    assert len(saved["samples"]) == 4      # 2 items x 2 filters
    assert saved["exemplars"] == ["mgsm-sw-exemplar-0"]   # MGSM's own first exemplar
    assert main(["eval", "--lm-eval", "--model", str(tiny["base"]), "--data", "gsm-symbolic",
                 "--n", "1"]) == 2          # lm-eval's tasks are MGSM only: a clear error
