"""The GSM8K calculator of the demo's decoding: arithmetic, note completion, real tokenizers."""
from __future__ import annotations

import re

import pytest

from layerswap_core.inference.calculator import Calculator, completion, evaluate, number_text


def test_evaluate_is_arithmetic_only():
    assert evaluate("4*80") == 320 and evaluate("92*3/4") == 69 and evaluate("(2+3)*-2") == -10
    assert evaluate("1,200 - 200") == 1000 and evaluate("$12*0.75") == 9
    for bad in ("__import__('os')", "2**100000", "x+1", "1/0", "", "4*"):
        assert evaluate(bad) is None
    assert number_text(9.0) == "9" and number_text(12.5) == "12.5"
    assert number_text(1 / 3) == "0.333333"


def test_completion_closes_the_open_note_only():
    assert completion("so 4*80=<<4*80=") == "320>>"
    assert completion("so 4*80=<<4*80=32") == "0>>"
    assert completion("so 4*80=<<4*80=320>>") is None            # closed
    assert completion("so 4*80=<<4*80=5") is None                # the model wrote otherwise
    assert completion("so 4*80=<<4*80") is None                  # no '=' yet
    assert completion("no note here = 3") is None
    assert completion("<<2+2=4>>4 then <<10/4=") == "2.5>>"


def test_calculator_forces_the_result_token_by_token(embedded_base):
    """With the embedded model's real tokenizer: feeding the forced tokens back in writes the
    result and the closing marks, then leaves the model free."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_base)
    calc = Calculator(tok)
    ids = tok.encode("She pays 62 * 0.5 = €<<62*0.5=", add_special_tokens=False)
    forced = []
    while (t := calc.next_token(ids + forced)) is not None:
        forced.append(t)
        assert len(forced) < 10
    assert tok.decode(forced) == "31>>"
    assert calc.next_token(tok.encode("no note", add_special_tokens=False)) is None


@pytest.mark.slow
def test_the_demo_math_expert_writes_notes_and_the_calculator_gets_them_right(embedded_base):
    """The shipped math expert writes GSM8K notes on held-out validation variants; with the
    calculator every note it closes holds the right result, and its answers are at least as
    often right as without it."""
    import torch

    from layerswap_core.checkpoints.loading import load_model
    from layerswap_core.demos.measure import score
    from layerswap_core.demos.variants import variant_items
    from layerswap_core.demos.heldout import DEMO_TASK
    from layerswap_core.demos.reproduce import spread

    model, tok = load_model(DEMO_TASK, dtype=torch.float32)
    items = spread(variant_items("en", "validation"), 8)
    with_calc = score("math", model, tok, items, max_new_tokens=160)
    without = score("math", model, tok, items, max_new_tokens=160, calculator=False)
    notes = [m for out in with_calc.outputs for m in re.findall(r"<<([^<>=]+)=([^<>]*)>>", out)]
    assert len(notes) >= len(items)
    assert all(number_text(evaluate(e)) == r for e, r in notes if evaluate(e) is not None)
    assert sum(with_calc.correct) >= sum(without.correct)
