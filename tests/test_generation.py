"""Batched greedy generation equals one-at-a-time generation; stop strings; streaming; chat."""
from __future__ import annotations

import pytest

from layerswap_core.inference.chat import chat, chat_prompt, stream_generate
from layerswap_core.inference.generation import cut_at_stop, generate, generate_one

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


def test_empty_prompt_continues_from_start_of_text(tiny_lm):
    model, tok = tiny_lm
    alone = generate(model, tok, [""], max_new_tokens=6)[0]
    assert alone.num_tokens == 6 and alone.text
    assert generate(model, tok, ["", "Hello"], max_new_tokens=6, batch_size=2)[0] == alone
    assert alone.text == generate(model, tok, [tok.bos_token], max_new_tokens=6)[0].text
    # nothing before the first token (no shared prefix, prompts of one token): transformers' text
    assert alone.text == _hf_greedy(model, tok, tok.bos_token, 6)


def test_stop_strings_cut_output_and_count_tokens(tiny_lm):
    model, tok = tiny_lm
    free = generate(model, tok, PROMPTS, max_new_tokens=12, batch_size=8)
    counted = 0
    # stop at a piece of text each free-running output contains after its first token
    for g, p in zip(free, PROMPTS):
        stop = g.text[len(g.text) // 2:][:3]
        if not stop.strip():
            continue
        cut = generate(model, tok, [p, PROMPTS[1]], max_new_tokens=12, stop=[stop], batch_size=2)[0]
        assert cut.text == g.text[:g.text.find(stop)]
        assert cut.stopped and cut.num_tokens < 12
        # the count ends where the stop string appeared, even while the other row goes on
        # (the row is then padded, here with the EOS id): as when the prompt runs alone
        alone = generate(model, tok, [p], max_new_tokens=12, stop=[stop], batch_size=1)[0]
        assert cut.num_tokens == alone.num_tokens
        counted += 1
    assert counted >= 3


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
    from layerswap_core.inference.prefill import common_prefix_len

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
        # rows' own tokens, in groups of similar length, then one batched step per new token
        assert max(widths[1:]) == max(len(e) for e in encoded) - common_prefix_len(encoded) - 1
        widths.clear()
        plain = generate(model, tok, prompts, max_new_tokens=8, batch_size=3, share_prefix=False)
        assert max(widths) == max(len(e) for e in encoded) - 1   # rows' own prompt pass
        widths.clear()
        padded = generate(model, tok, prompts, max_new_tokens=8, batch_size=3, share_prefix=False,
                          split_prefill=False)
        assert max(widths) == max(len(e) for e in encoded)       # one padded batch
    finally:
        hook.remove()
    assert [g.text for g in padded] == [g.text for g in plain]
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


def _hf_greedy(model, tok, prompt: str, max_new_tokens: int) -> str:
    """Reference: plain transformers generate on one unpadded prompt."""
    import torch

    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, temperature=None, top_p=None, top_k=None,
                         pad_token_id=tok.eos_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


FEW_SHOT = [("Question: Ali has 3 apples and buys 4 more. How many apples does he have?\n"
             "Answer: 7\n\n" * 2) + f"Question: {q}\nAnswer:" for q in
            ("Janet's ducks lay 16 eggs per day. She eats three. How many eggs are left?",
             "What is 5 + 5?", "Swali: Treni inasafiri km 60 kwa saa moja. Inasafiri km ngapi kwa saa 3?",
             "Is 12 larger than 7?")]


@pytest.mark.parametrize("model_type", ["embedded", "gpt_neox", "mistral"])
def test_batched_equals_plain_transformers_generate(tmp_path, embedded_base, model_type):
    """Our batched generation (shared prefix, grouped prompt pass, in-place cache; for
    Mistral's sliding-window cache the padded fallback) gives transformers' own greedy text.
    The real SmolLM2 (Llama) is sensitive to any slip in positions or cache layout; tiny random
    models cover the other cache shapes."""
    from layerswap_core.inference.prefill import plain_cache_ok
    from layerswap_core.checkpoints.loading import load_model
    from layerswap_core.testing import make_tiny_model

    if model_type == "embedded":
        model, tok = load_model(embedded_base)
    else:
        model, tok = load_model(make_tiny_model(tmp_path / model_type, num_layers=4, seed=3,
                                                model_type=model_type))
    assert plain_cache_ok(model) == (model_type != "mistral")
    for prompts in (FEW_SHOT, PROMPTS[:4]):     # one batch with a shared prefix, one without
        got = generate(model, tok, prompts, max_new_tokens=10, batch_size=4)
        assert [g.text for g in got] == [_hf_greedy(model, tok, p, 10) for p in prompts]
        if model_type == "embedded":
            assert len({g.text for g in got}) == len(prompts)


def test_prefill_groups_cover_rows_and_bound_padding():
    from layerswap_core.inference.prefill import prefill_groups

    lengths = [130, 59, 0, 94, 62, 205, 99, 90, 130, 210, 105, 121, 1, 136, 121, 126, 120, 210]
    groups = prefill_groups(lengths, slack=0.125, max_tokens=600)
    members = sorted(i for g in groups for i in g)
    assert members == [i for i, n in enumerate(lengths) if n > 0]      # each once; no empty rows
    for g in groups:
        real, padded = sum(lengths[i] for i in g), len(g) * max(lengths[i] for i in g)
        assert padded <= 1.125 * real and (padded <= 600 or len(g) == 1)
    assert len(groups) < len(members)                                   # similar rows do group
    assert prefill_groups([5, 5, 5], max_tokens=10) == [[0, 1], [2]]


def test_growing_cache_layer_matches_concatenation():
    import torch

    from layerswap_core.inference.prefill import growing_layer_class

    grow = growing_layer_class()
    torch.manual_seed(0)
    k0, v0 = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    buf_k, buf_v = torch.zeros(2, 3, 7, 4), torch.zeros(2, 3, 7, 4)
    buf_k[:, :, :5], buf_v[:, :, :5] = k0, v0
    layer = grow(buf_k, buf_v, 5)
    keys, values = k0, v0
    for step in range(6):                      # past the spare room of 2: re-buffers
        k, v = torch.randn(2, 3, 1 + step % 2, 4), torch.randn(2, 3, 1 + step % 2, 4)
        got_k, got_v = layer.update(k, v)
        keys, values = torch.cat([keys, k], -2), torch.cat([values, v], -2)
        assert torch.equal(got_k, keys) and torch.equal(got_v, values)
        assert layer.get_seq_length() == keys.shape[-2]
    layer.crop(-3)                             # transformers' own edits are picked up
    keys, values = keys[:, :, :-3], values[:, :, :-3]
    layer.batch_select_indices(torch.tensor([1]))
    k, v = torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4)
    got_k, _ = layer.update(k, v)
    assert torch.equal(got_k, torch.cat([keys[1:], k], -2))


def test_finished_rows_leave_the_batch_and_change_nothing(embedded_base):
    """Rows that hit their stop string drop out of the decoding batch; every text still equals
    transformers' greedy output cut at the stop, and counts equal running alone."""
    from layerswap_core.inference.generation import cut_at_stop
    from layerswap_core.checkpoints.loading import load_model

    model, tok = load_model(embedded_base)
    prompts = FEW_SHOT + [p + " 7 and then" for p in FEW_SHOT[:2]]
    free = [_hf_greedy(model, tok, p, 12) for p in prompts]
    for stop in (["\n\n"], ["."]):
        sizes = []
        hook = model.register_forward_pre_hook(
            lambda mod, args, kw: sizes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
        try:
            got = generate(model, tok, prompts, max_new_tokens=12, stop=stop, batch_size=6,
                           lookahead=0)   # every pass one token wide, to count the rows
        finally:
            hook.remove()
        steps = [rows for rows, width in sizes if width == 1]
        assert steps[0] == 6 and min(steps) < 6 and steps == sorted(steps, reverse=True)
        assert len({g.num_tokens for g in got}) > 1                       # ragged lengths
        assert [g.text for g in got] == [cut_at_stop(f, stop)[0] for f in free]
    alone = [generate(model, tok, [p], max_new_tokens=12, stop=stop)[0] for p in prompts]
    assert [g.num_tokens for g in got] == [a.num_tokens for a in alone]


def test_generation_config_beyond_argmax_goes_through_transformers(tiny):
    """A model whose generation_config asks for a repetition penalty still gets it."""
    from layerswap_core.inference.generation import plain_greedy_ok
    from layerswap_core.checkpoints.loading import load_model

    model, tok = load_model(tiny["base"])
    plain = generate(model, tok, PROMPTS[:3], max_new_tokens=12, batch_size=3)
    assert plain_greedy_ok(model)
    model.generation_config.repetition_penalty = 1.8
    assert not plain_greedy_ok(model)
    got = generate(model, tok, PROMPTS[:3], max_new_tokens=12, batch_size=3)
    assert [g.text for g in got] == [_hf_greedy(model, tok, p, 12) for p in PROMPTS[:3]]
    assert [g.text for g in got] != [g.text for g in plain]


def test_refilled_batch_equals_one_by_one_token_for_token(embedded_base):
    """More prompts than batch places, ragged stops: a row that finishes hands its place to the
    next prompt (its prompt run on top of the shared prefix, written into the cache at the
    current column). Every output equals the prompt decoded alone, token for token, and the
    batch stays full while prompts are waiting (fewer decoding steps than batch after batch)."""
    from layerswap_core.checkpoints.loading import load_model

    model, tok = load_model(embedded_base)
    prompts = FEW_SHOT + [p + " 7 and then" for p in FEW_SHOT[:3]]
    stop = ["."]
    sizes = []
    hook = model.register_forward_pre_hook(
        lambda mod, args, kw: sizes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        refilled = generate(model, tok, prompts, max_new_tokens=12, stop=stop, batch_size=3,
                            lookahead=0)
        steps_refilled = [rows for rows, width in sizes if width == 1]
        sizes.clear()
        batches = generate(model, tok, prompts, max_new_tokens=12, stop=stop, batch_size=3,
                           refill=False, lookahead=0)
        steps_batches = [rows for rows, width in sizes if width == 1]
    finally:
        hook.remove()
    alone = [generate(model, tok, [p], max_new_tokens=12, stop=stop, refill=False)[0]
             for p in prompts]
    assert len({g.num_tokens for g in alone}) > 2                        # ragged lengths
    assert refilled == alone and batches == alone    # text, token counts, stopped: all equal
    assert [g.text for g in refilled] == [cut_at_stop(_hf_greedy(model, tok, p, 12), stop)[0]
                                          for p in prompts]
    assert len(steps_refilled) < len(steps_batches)
    assert steps_refilled[0] == 3 and steps_refilled.count(3) > len(steps_refilled) // 2


def test_refills_run_their_prompts_ahead_in_groups(embedded_base, monkeypatch):
    """The prompts waiting for a place have their own tokens run several at a time, before a
    place frees (up to a batch ahead): each prompt once, in far fewer passes than there are
    refills, and every output still equals the prompt decoded alone."""
    from layerswap_core.checkpoints.loading import load_model
    from layerswap_core.inference import decoding

    model, tok = load_model(embedded_base)
    prompts = FEW_SHOT + [p + " 7 and then" for p in FEW_SHOT] + [p + " so" for p in FEW_SHOT]
    alone = [generate(model, tok, [p], max_new_tokens=8, stop=["."], refill=False)[0]
             for p in prompts]
    runs = []
    own_kv = decoding.own_kv
    monkeypatch.setattr(decoding, "own_kv", lambda model, seqs, *a: (
        runs.append(len(seqs)), own_kv(model, seqs, *a))[1])
    got = generate(model, tok, prompts, max_new_tokens=8, stop=["."], batch_size=2, lookahead=0)
    assert got == alone
    assert sum(runs) == len(prompts)               # each prompt's own tokens run once
    assert runs[0] == 4                            # the first batch and the next one
    assert len(runs) <= 1 + -(-(len(prompts) - 4) // 3)    # then up to 1 + 2 at a time
    assert len(runs) < len(prompts) - 2            # fewer than the refills (one per prompt)


def test_refill_relayout_keeps_rows(embedded_base, monkeypatch):
    """A longer prompt arriving after shorter ones (the cache is laid out again to make room)
    and a cache that fills up (compacted) change no output."""
    import torch

    from layerswap_core.checkpoints.loading import load_model
    from layerswap_core.inference import decoding
    from layerswap_core.inference.prefill import kv_layers, shared_prefix
    from layerswap_core.inference.stops import eos_ids

    model, tok = load_model(embedded_base)
    prompts = [FEW_SHOT[1], FEW_SHOT[3], FEW_SHOT[0], FEW_SHOT[2]]      # shortest first
    rows = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    assert len(rows[2]) > max(len(rows[0]), len(rows[1])) + 10   # > max_new_tokens
    layouts = []
    relayout = decoding.Slots.relayout
    monkeypatch.setattr(decoding.Slots, "relayout",
                        lambda self, n: (layouts.append(n), relayout(self, n))[1])
    alone = [generate(model, tok, [p], max_new_tokens=10, stop=["."], refill=False)[0]
             for p in prompts]
    n_prefix, cache = shared_prefix(model, rows, "cpu")
    for capacity in (None, 1):                 # 1: the cache is full at once and compacted
        layouts.clear()
        with torch.inference_mode():
            got = decoding.refill_decode(
                model, tok, rows, 2, n_prefix, kv_layers(cache), tok.eos_token_id, "cpu", 10,
                set(eos_ids(model, tok)), ["."], capacity=capacity)
        assert layouts                          # laid out again at least once
        assert [len(t) for t in got] == [g.num_tokens for g in alone]
        assert [cut_at_stop(tok.decode(t, skip_special_tokens=True), ["."])[0]
                for t in got] == [g.text for g in alone]


def test_drafter_drafts_what_followed_and_continues_loops():
    from layerswap_core.inference.decoding import Drafter, pass_width

    d = Drafter([5, 6, 7, 8, 9, 5, 6])
    assert d.draft(3) == [7, 8, 9]          # what followed "5 6" before
    assert d.draft(0) == []
    loop = Drafter([1, 2, 3, 4, 3, 4])
    assert loop.draft(5) == [3, 4, 3, 4, 3]  # its own loop, continued past the end
    assert Drafter([1, 2, 3]).draft(4) == []  # nothing seen before
    before = loop.rate
    loop.record(4, 4)
    assert loop.rate > before
    for _ in range(3):
        loop.record(4, 0)
    assert loop.rate < before
    # rows whose drafts hold are fed wide passes, rows whose drafts fail one token at a time
    assert pass_width([[1] * 16] * 4, [0.95] * 4) > 8
    assert pass_width([[1] * 16] * 16, [0.05] * 16) == 1
    assert pass_width([[], [], []], [0.9] * 3) == 1


def test_lookahead_gives_the_greedy_tokens_in_fewer_passes(embedded_base, monkeypatch):
    """Drafted tokens (what followed the same tokens earlier) are verified in one pass and kept
    where they equal the argmax: every output equals the prompt decoded alone, token for token,
    with fewer passes than tokens, more prompts than places (refilled rows), and a cache that
    fills up with the holes of rejected drafts (compacted)."""
    import torch

    from layerswap_core.checkpoints.loading import load_model
    from layerswap_core.inference import decoding
    from layerswap_core.inference.prefill import kv_layers, shared_prefix
    from layerswap_core.inference.stops import eos_ids

    model, tok = load_model(embedded_base)
    prompts = FEW_SHOT[:2] + ["Count: 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,",
                              "Question: Repeat after me: the cat sat on the mat. The cat sat on"]
    n = 16
    alone = [generate(model, tok, [p], max_new_tokens=n, lookahead=0)[0] for p in prompts]
    # (the other prompts' one-by-one text is checked against transformers above)
    assert [g.text for g in alone[-2:]] == [_hf_greedy(model, tok, p, n) for p in prompts[-2:]]
    widths, passes, steps = [], [], []

    def seen(mod, args, kw):
        widths.append(tuple(kw["input_ids"].shape))
        layers = getattr(kw.get("past_key_values"), "layers", None)
        if layers and hasattr(layers[0], "_kbuf"):       # a decoding pass of the refilled batch
            passes.append(kw["input_ids"].shape[1])

    hook = model.register_forward_pre_hook(seen, with_kwargs=True)
    advance = decoding.Slots.advance
    monkeypatch.setattr(decoding.Slots, "advance",
                        lambda self, k: (steps.append(k), advance(self, k))[1])
    try:
        got = generate(model, tok, prompts, max_new_tokens=n, batch_size=3)
    finally:
        hook.remove()
        monkeypatch.undo()
    assert got == alone
    decode_widths = [w for rows, w in widths if rows <= 3 and w <= decoding.LOOKAHEAD + 1]
    assert max(decode_widths) > 1                            # drafts were fed
    assert sum(g.num_tokens for g in got) > 2 * len(decode_widths)
    # the cache grows by the drafts some row kept, not by every pass's width: the columns of
    # drafts no row kept are written over by the next pass (and the outputs above are equal)
    assert len(steps) == len(passes) and sum(steps) < sum(passes)
    assert all(1 <= k <= w for k, w in zip(steps, passes))

    rows = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts[:2]]   # one prefix
    n_prefix, cache = shared_prefix(model, rows, "cpu")
    layouts = []
    relayout = decoding.Slots.relayout
    monkeypatch.setattr(decoding.Slots, "relayout",
                        lambda self, k: (layouts.append(k), relayout(self, k))[1])
    with torch.inference_mode():
        tokens = decoding.refill_decode(
            model, tok, rows, 1, n_prefix, kv_layers(cache), tok.eos_token_id, "cpu", n,
            set(eos_ids(model, tok)), [], capacity=1, lookahead=8)
    assert layouts
    assert [tok.decode(t, skip_special_tokens=True) for t in tokens] == [
        g.text for g in alone[:2]]


def test_packed_attention_equals_sdpa_and_changes_nothing_outside(embedded_base, monkeypatch):
    """Query heads folded onto their shared key/value head give sdpa's attention (SmolLM2 has
    3 query heads per key/value head) within ``packed_attention``, and outside it the switched
    model computes exactly what it did before."""
    import torch

    from layerswap_core.checkpoints.loading import load_model
    from layerswap_core.inference import attention

    model, tok = load_model(embedded_base)
    assert model.config.num_attention_heads > model.config.num_key_value_heads
    ids = torch.tensor([tok(FEW_SHOT[0], add_special_tokens=False)["input_ids"][:24]] * 2)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0                                            # a left-padded row
    calls, masks = [], []

    def watched(q, *a, **k):
        calls.append(tuple(q.shape))
        masks.append(k["attn_mask"])
        return sdpa(q, *a, **k)

    def boolean_mask(mask, groups, dtype):                     # folded, left to sdpa to convert
        b, _, q_len, keys = mask.shape
        return mask.expand(b, groups, q_len, keys).reshape(b, 1, groups * q_len, keys)

    with torch.inference_mode():
        before = model(input_ids=ids, attention_mask=mask).logits
        with attention.packed_attention(model):
            assert model.config._attn_implementation == attention.NAME
            sdpa = torch.nn.functional.scaled_dot_product_attention   # the real one, watched
            with monkeypatch.context() as m:
                m.setattr(torch.nn.functional, "scaled_dot_product_attention", watched)
                packed = model(input_ids=ids, attention_mask=mask).logits
            with monkeypatch.context() as m:
                m.setattr(attention, "_pass_mask", boolean_mask)
                packed_boolean = model(input_ids=ids, attention_mask=mask).logits
        assert attention._local.mask is None                   # the pass's mask is let go
        after = model(input_ids=ids, attention_mask=mask).logits
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    assert calls and all(c[1] == model.config.num_key_value_heads and c[2] == 24 * groups
                         for c in calls)                        # folded, never repeated
    # one additive mask for the whole pass, made once, and the same attention bit for bit as
    # sdpa's own conversion of the boolean mask in every layer
    assert len(calls) == model.config.num_hidden_layers
    assert all(m is masks[0] for m in masks) and masks[0].dtype == torch.float32
    assert torch.equal(packed, packed_boolean)
    assert torch.equal(after, before)
    assert torch.allclose(packed[:, 5:], before[:, 5:], atol=1e-4, rtol=1e-4)
    assert torch.equal(packed[:, 5:].argmax(-1), before[:, 5:].argmax(-1))


def test_split_head_gives_the_same_logits_and_changes_nothing_outside(embedded_base,
                                                                      monkeypatch):
    """Within ``split_head`` the embedded model's output layer computes its logits a block of
    vocabulary rows at a time, and they equal the whole product bit for bit (the shapes of
    decoding passes: a few rows of one to a few tokens); outside it, and in another thread,
    the layer runs ``nn.Linear``'s own product (compared within the same thread: a new thread
    may run another number of threads, and the kernel's sums with them); copies and pickles of
    the model keep working."""
    import copy
    import io
    import threading

    import torch

    from layerswap_core.checkpoints.loading import load_model
    from layerswap_core.inference import products as head_mod

    model, tok = load_model(embedded_base)
    lm_head = model.get_output_embeddings()
    assert lm_head.weight.shape[0] >= 2 * head_mod.BLOCK
    ids = torch.tensor([tok(FEW_SHOT[0], add_special_tokens=False)["input_ids"][:40]] * 2)
    products = []
    linear = torch.nn.functional.linear
    with torch.inference_mode():
        hidden = model.model(input_ids=ids).last_hidden_state            # [2, 40, hidden]
        whole = {rows: lm_head(hidden.reshape(-1, hidden.shape[-1])[:rows]) for rows in
                 (1, 3, 16, 32, 80)}
        with monkeypatch.context() as m:
            m.setattr(torch.nn.functional, "linear",
                      lambda x, w, b=None: (products.append(w.shape[0]), linear(x, w, b))[1])
            with head_mod.split_head(model):
                assert type(lm_head) is head_mod.CpuLinear
                split = {rows: lm_head(hidden.reshape(-1, hidden.shape[-1])[:rows])
                         for rows in whole}
                split_3d = lm_head(hidden[:, -5:])
                other = []
                t = threading.Thread(target=lambda: other.append(
                    (lm_head(hidden[:, -5:]), linear(hidden[:, -5:], lm_head.weight))))
                t.start()
                t.join()
            n_split = len(products)
            after = lm_head(hidden[:, -5:])
    assert all(torch.equal(split[r], whole[r]) for r in whole)
    assert torch.equal(split_3d, whole[80].reshape(2, 40, -1)[:, -5:])
    blocks = -(-lm_head.weight.shape[0] // head_mod.BLOCK)
    assert n_split == blocks * (len(whole) + 1) + 1      # the other thread: one whole product
    assert products[-1] == lm_head.weight.shape[0]       # outside the block: one whole product
    assert torch.equal(*other[0]) and torch.equal(after, split_3d)
    twin = copy.deepcopy(model)
    assert type(twin.get_output_embeddings()) is head_mod.CpuLinear
    buf = io.BytesIO()
    torch.save(lm_head, buf)
    buf.seek(0)
    assert type(torch.load(buf, weights_only=False)) is head_mod.CpuLinear


@pytest.mark.parametrize("model_type", ["embedded", "gpt_neox"])
def test_packed_products_keep_the_greedy_text_and_change_nothing_outside(tmp_path, embedded_base,
                                                                         model_type, monkeypatch):
    """Inside ``packed_products`` short products by the model's linear layers (biases too, for
    GPT-NeoX) run on oneDNN's prepacked weights (a layer's projections that read the same input
    stacked into one product, equal bit for bit): within float rounding of torch's own, the
    output layer first when the budget is short, long prompt passes and other threads on
    torch's own products bit for bit, nothing changed after the block. ``generate`` packs
    when enough steps may follow, and its greedy text equals the text with plain products and
    transformers' own greedy decoding."""
    import threading

    import torch

    from layerswap_core.checkpoints.loading import load_model
    from layerswap_core.inference import products
    from layerswap_core.testing import make_tiny_model

    if model_type == "embedded":
        model, tok = load_model(embedded_base)
    else:
        model, tok = load_model(make_tiny_model(tmp_path / model_type, num_layers=4, seed=3,
                                                model_type=model_type))
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    head = model.get_output_embeddings()
    ids = torch.tensor([tok(FEW_SHOT[0], add_special_tokens=False)["input_ids"]] * 3)
    short = ids[:, -4:]
    long = ids.reshape(1, -1).repeat(1, 8)[:, :products.PACKED_ROWS + 1]
    assert long.shape[1] == products.PACKED_ROWS + 1
    with torch.inference_mode():
        plain_short, plain_long = model(input_ids=short).logits, model(input_ids=long).logits
        with products.packed_products(model) as n:
            assert n == len(linears) and all(type(m) is products.CpuLinear for m in linears)
            # each layer's q/k/v projections and gate/up projections are stacked into one
            # product (GPT-NeoX has its query_key_value already, and no gate)
            stacked = 3 * model.config.num_hidden_layers if model_type == "embedded" else 0
            assert len({id(p) for p in products._local.packed.values()}) == n - stacked
            packed_short, packed_long = model(input_ids=short).logits, model(input_ids=long).logits
            stacks = {id(p): p for p in products._local.packed.values()
                      if type(p) is products._Stacked}.values()
            assert len(stacks) == 2 * stacked // 3 and all(p.last is None for p in stacks)
            other = []
            t = threading.Thread(target=lambda: other.append(model(input_ids=short).logits))
            t.start()
            t.join()
        after = model(input_ids=short).logits
        t = threading.Thread(target=lambda: other.append(model(input_ids=short).logits))
        t.start()
        t.join()
        size = head.weight.numel() * head.weight.element_size()
        with products.packed_products(model, budget=size) as only_head:
            assert only_head == 1 and set(products._local.packed) == {head}
        with monkeypatch.context() as m:
            m.setattr(products, "_shared_inputs", lambda model, fit: {})
            with products.packed_products(model) as n_alone:
                alone_short = model(input_ids=short).logits
        assert n_alone == n
        assert torch.equal(packed_short, alone_short)    # stacked: the same products bit for bit
    # the products sum in another order: the embedded model's logits (up to about 28) move by
    # about 1e-4, where feeding 4 tokens a row instead of 3 moves them by about 4e-5 (the tiny
    # model's short sums happen to come out equal)
    assert torch.equal(packed_short, plain_short) == (model_type != "embedded")
    assert (packed_short - plain_short).abs().max() <= 1e-5 * plain_short.abs().max() + 1e-3
    assert torch.equal(packed_short.argmax(-1), plain_short.argmax(-1))
    assert torch.equal(packed_long, plain_long)                  # too many rows: torch's own
    assert torch.equal(after, plain_short) and products._local.packed is None
    assert torch.equal(other[0], other[1])     # another thread: torch's own, block or not

    import layerswap_core.inference.generation as gen_mod

    calls = []
    real = products.packed_products
    monkeypatch.setattr(gen_mod, "packed_products",
                        lambda m, budget=None: (calls.append(m), real(m, budget))[1])
    monkeypatch.setattr(gen_mod, "PACK_AFTER_STEPS", 32)
    prompts = FEW_SHOT[:2] + PROMPTS[:2]      # 2 batches of 2 x 16 tokens: enough steps to pack
    fast = generate(model, tok, prompts, max_new_tokens=16, batch_size=2)
    short_run = generate(model, tok, prompts[:1], max_new_tokens=8)
    assert calls == [model]                  # the long run packed, the 8-token one did not
    slow = generate(model, tok, prompts, max_new_tokens=16, batch_size=2, packed=False)
    assert fast == slow and short_run[0].text == slow[0].text[:len(short_run[0].text)]
    if model_type == "embedded":
        assert fast[0].text == _hf_greedy(model, tok, prompts[0], 16)


def test_cudnn_attention_is_off_inside_cuda_blocks_and_restored_after_the_last():
    """``without_cudnn_attention`` flips PyTorch's process-wide switch (which a CPU build keeps
    too) only for a CUDA device; blocks nest and overlap across threads, and the setting from
    before the first block returns when the last one closes, whichever thread closes it."""
    import threading

    import torch

    from layerswap_core.inference.attention import without_cudnn_attention

    enabled = torch.backends.cuda.cudnn_sdp_enabled
    original = enabled()
    try:
        for before in (True, False):
            torch.backends.cuda.enable_cudnn_sdp(before)
            with without_cudnn_attention(torch.device("cpu")):
                assert enabled() is before
            with without_cudnn_attention("cuda:0"):
                assert enabled() is False
                with without_cudnn_attention(torch.device("cuda")):
                    assert enabled() is False
                assert enabled() is False
            assert enabled() is before

        torch.backends.cuda.enable_cudnn_sdp(True)
        first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
        seen = []

        def first():
            with without_cudnn_attention("cuda"):
                first_in.set()
                second_in.wait(10)
            first_out.set()

        def second():
            first_in.wait(10)
            with without_cudnn_attention("cuda"):
                second_in.set()
                first_out.wait(10)
                seen.append(enabled())      # the first block closed; this one still open
            seen.append(enabled())

        threads = [threading.Thread(target=f) for f in (first, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert seen == [False, True]
    finally:
        torch.backends.cuda.enable_cudnn_sdp(original)

