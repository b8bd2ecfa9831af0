"""Batched greedy generation equals one-at-a-time generation; stop strings; streaming; chat."""
from __future__ import annotations

import pytest

from layerswap_core.generation import chat, chat_prompt, cut_at_stop, generate, generate_one, stream_generate

PROMPTS = [
    "Swali: Bata wa Janet hutaga mayai 16 kila siku.\nAnswer:",
    "Hello",
    "Question: Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning "
    "and bakes muffins for her friends every day with four. How much does she make?\nAnswer:",
    "প্রশ্ন: জ্যানেটের হাঁসগুলি প্রতিদিন 16টি করে ডিম পাড়ে।",
    "12 + 7 =",
    "a b c d e f g h i j k l m n o p q r s t",
    "ప్రశ్న: 3 + 4?",
]


pytestmark = pytest.mark.usefixtures("one_thread")



def test_batched_equals_one_by_one(tiny_lm):
    model, tok = tiny_lm
    batched = generate(model, tok, PROMPTS, max_new_tokens=12, batch_size=4)
    single = [generate(model, tok, [p], max_new_tokens=12, batch_size=1)[0] for p in PROMPTS]
    assert [g.text for g in batched] == [g.text for g in single]
    assert [g.num_tokens for g in batched] == [g.num_tokens for g in single]
    assert all(g.num_tokens == 12 for g in batched)   # random tiny model: no EOS within 12
    assert len({g.text for g in batched}) > 1          # outputs differ per prompt


def test_stop_strings_cut_output_and_count_tokens(tiny_lm):
    model, tok = tiny_lm
    free = generate(model, tok, PROMPTS, max_new_tokens=12, batch_size=8)
    # stop at a piece of text each free-running output contains after its first token
    for g, p in zip(free, PROMPTS):
        stop = g.text[len(g.text) // 2:][:3]
        if not stop.strip():
            continue
        cut = generate(model, tok, [p, PROMPTS[1]], max_new_tokens=12, stop=[stop], batch_size=2)[0]
        assert cut.text == g.text[:g.text.find(stop)]
        assert cut.stopped and cut.num_tokens < 12


def test_cut_at_stop_takes_earliest():
    assert cut_at_stop("18\n\nSwali: x", ["Swali:", "\n\n"]) == ("18", True)
    assert cut_at_stop("18", ["Swali:"]) == ("18", False)


def test_stream_ends_with_the_generated_text(tiny_lm):
    model, tok = tiny_lm
    pieces = list(stream_generate(model, tok, PROMPTS[0], max_new_tokens=10))
    assert pieces and pieces[-1] == generate_one(model, tok, PROMPTS[0], max_new_tokens=10)
    assert all(b.startswith(a) for a, b in zip(pieces, pieces[1:]))   # cumulative
    # leaving the stream early stops the generating thread (no hang, no error)
    stream = stream_generate(model, tok, PROMPTS[1], max_new_tokens=200)
    next(stream)
    stream.close()


def test_chat_uses_template(tiny_lm):
    model, tok = tiny_lm
    prompt = chat_prompt(tok, "Hi", system="Be brief.")
    assert "Be brief." in prompt and prompt.rstrip().endswith("assistant")
    reply = chat(model, tok, [{"role": "user", "content": "Hi"}], max_new_tokens=5)
    assert reply == generate_one(model, tok, chat_prompt(tok, "Hi"), max_new_tokens=5)
    assert list(chat(model, tok, "Hi", max_new_tokens=5, stream=True))[-1] == reply


def test_shared_prefix_is_computed_once_and_changes_nothing(tiny_lm):
    from layerswap_core.generation import common_prefix_len

    model, tok = tiny_lm
    shots = "Swali: Juma ana maembe 3 na ananunua 4 zaidi. Ana maembe mangapi?\nAnswer:7\n\n" * 3
    prompts = [shots + f"Swali: {q}\nAnswer:" for q in
               ("Bata wa Janet hutaga mayai 16 kila siku.", "Ana 5?", "Kuna ndege 12 mtini, 3 wanaruka.")]
    encoded = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    assert common_prefix_len(encoded) >= 60
    widths = []
    hook = model.register_forward_pre_hook(
        lambda mod, args, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        shared = generate(model, tok, prompts, max_new_tokens=8, batch_size=3)
        assert widths[0] == common_prefix_len(encoded)           # the prefix pass
        assert max(widths[1:]) < max(len(e) for e in encoded)    # batches skip the prefix
        widths.clear()
        plain = generate(model, tok, prompts, max_new_tokens=8, batch_size=3, share_prefix=False)
        assert max(widths) == max(len(e) for e in encoded)
    finally:
        hook.remove()
    single = [generate(model, tok, [p], max_new_tokens=8)[0] for p in prompts]
    assert [g.text for g in shared] == [g.text for g in plain] == [g.text for g in single]
    # mixed languages: each batch shares its own prefix, results still in input order
    mixed = [prompts[0], "Question: " + "two plus two, " * 10 + "?\nAnswer:", prompts[1],
             "Question: " + "two plus two, " * 10 + "three?\nAnswer:"]
    got = generate(model, tok, mixed, max_new_tokens=8, batch_size=2)
    assert [g.text for g in got] == [generate(model, tok, [p], max_new_tokens=8)[0].text for p in mixed]


def test_chat_sampling_settings(tiny_lm):
    import torch

    model, tok = tiny_lm
    greedy = chat(model, tok, "Hi", max_new_tokens=8)
    assert chat(model, tok, "Hi", max_new_tokens=8, temperature=0.0) == greedy
    torch.manual_seed(0)
    a = chat(model, tok, "Hi", max_new_tokens=8, temperature=1.5, top_p=0.95)
    torch.manual_seed(0)
    b = chat(model, tok, "Hi", max_new_tokens=8, temperature=1.5, top_p=0.95)
    assert a == b  # seeded sampling repeats
    samples = set()
    for seed in range(4):
        torch.manual_seed(seed)
        samples.add(chat(model, tok, "Hi", max_new_tokens=8, temperature=1.5))
    assert len(samples) > 1  # and actually samples
    with pytest.raises(ValueError, match="temperature"):
        chat(model, tok, "Hi", temperature=-1)
