"""Compare the candidate embedded bases for the demo: SmolLM2-135M-Instruct and Gemma-3-270M.

For each base (converted into the embedded cache on first use):

* parameters: total and the embedding matrix's share (both bases tie it to the LM head);
* tokens per word of the same GSM-Symbolic question texts (original instances of templates
  0000-0099) in English, Swahili and Bengali, and tokens relative to English;
* full fine-tuning speed: seconds per 1k training tokens of forward+backward and of the AdamW
  step, one sequence of 256 tokens per step, in fp32, fp32 with bf16 autocast, pure bf16, and
  pure bf16 with the (tied) embedding frozen
  (the AdamW step is left out when the shared machine has no room for its moments);
* greedy generation: new tokens per second at batch 8 (fp32 and bf16);
* accuracy of the base model on held-out GSM-Symbolic *variants* (new numbers and names, fixed
  seed) of evaluation templates 0050-0099 that are not MGSM items, in English and Swahili:
  2-shot chain of thought with the library's prompts and exemplars (training templates of the
  same language), answer = last number; with --zero-shot also 0-shot (chat template where the
  tokenizer has one);
* teacher-forced NLL of the English worked solutions of those variants (after their question)
  and of the Swahili question texts (after "Swali:"), per token and per whitespace word (the
  tokenizers differ, so only nats per word compare across bases).

Prompts start with the BOS token where the tokenizer's own encoding does (Gemma: ``<bos>``),
as the library's evaluation and training encode them (``checkpoints.tokenizers.encode_prompt``).

Everything runs on 1 CPU thread (``--threads``). On a shared machine the timings are noisy:
each timing is the median of a few repeats; compare within one run.

    HF_HUB_OFFLINE=1 PYTHONPATH=. python bench/base_candidates.py [--n 40] [--json out.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import tomllib
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from layerswap_core.checkpoints.loading import load_model  # noqa: E402
from layerswap_core.checkpoints.references import resolve  # noqa: E402
from layerswap_core.evaluation.data import Item, mgsm_overlap_templates  # noqa: E402
from layerswap_core.evaluation.mgsm_task import prompt_words  # noqa: E402
from layerswap_core.inference.generation import generate  # noqa: E402
from layerswap_core.evaluation.mgsm_task import stop_strings  # noqa: E402
from layerswap_core.evaluation.runner import (build_prompt, default_exemplars,  # noqa: E402
                                              extract_answer, gold_nll, is_correct,
                                              question_text, target_text, wilson_interval)
from layerswap_core.training.recipes import (strip_calculator, templates_dir)  # noqa: E402

BASES = {"SmolLM2-135M-Instruct": "embedded:smollm2-135m-instruct",
         "Gemma-3-270M": "embedded:gemma3-270m"}
FERTILITY_LANGS = ("eng", "swh", "ben")
EVAL_LANGS = {"en": "eng", "sw": "swh"}
# Evaluation templates whose variant generator takes > 2 s on this CPU (measured with the
# package's AnnotatedQuestion.generate_questions); left out to keep the bench short.
SLOW_EVAL_TEMPLATES = frozenset({52, 59, 74, 76, 80, 82, 94, 99})
SEED = 20260
SEQ_LEN, TRAIN_BATCH, TRAIN_STEPS = 256, 1, 3
GEN_BATCH, GEN_TOKENS = 8, 32
TRAIN_MODES = ("fp32", "fp32+autocast", "bf16", "bf16, embeddings frozen")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data
def template_text(lang: str, index: int) -> dict:
    with (templates_dir(lang) / f"{index:04d}.toml").open("rb") as f:
        return tomllib.load(f)


def fertility_texts() -> dict[str, list[str]]:
    """The question text of templates 0000-0099 in each language (validated or not: the
    translations exist for all; Bengali has only 2 validated templates)."""
    return {lang: [template_text(lang, i)["question"].strip() for i in range(100)]
            for lang in FERTILITY_LANGS}


def eval_templates() -> list[int]:
    """Templates 0050-0099 that are not MGSM items, validated in every evaluated language and
    quick to instantiate."""
    out = []
    for i in range(50, 100):
        if i in mgsm_overlap_templates() or i in SLOW_EVAL_TEMPLATES:
            continue
        if any(template_text(code, i).get("ignore") for code in EVAL_LANGS.values()):
            continue
        out.append(i)
    return out


def variants(lang: str, n: int, seed: int = SEED) -> list[Item]:
    """``n`` generated variants (not the template's own instance) of the evaluation templates,
    round-robin over templates (variant k of every template before variant k+1)."""
    from multilingual_gsm_symbolic.templates import AnnotatedQuestion

    from layerswap_core.evaluation.data import _FINAL, normalize_number

    code = EVAL_LANGS[lang]
    templates = eval_templates()
    per = -(-n // len(templates))
    by_template = {}
    for i in templates:
        aq = AnnotatedQuestion.from_toml(templates_dir(code) / f"{i:04d}.toml")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qs = aq.generate_questions(per, seed=seed + i, verbose=False)
        items = []
        for k, q in enumerate(qs):
            final = _FINAL.findall(q.answer.rstrip())
            number = normalize_number(final[-1]) if final else None
            if number is None:
                continue
            solution = " ".join(line.strip() for line in
                                strip_calculator(_FINAL.split(q.answer.rstrip())[0]).splitlines()
                                if line.strip())
            items.append(Item(f"gsm-symbolic-{code}-{i:04d}-v{seed}-{k}", "gsm-symbolic", lang,
                              q.question.strip(), number, solution))
        by_template[i] = items
    rounds = [[items[k] for items in by_template.values() if k < len(items)] for k in range(per)]
    return [it for r in rounds for it in r][:n]


# --------------------------------------------------------------------------- measurements
def parameters(model) -> dict:
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    return {"total_M": round(total / 1e6, 1), "embedding_M": round(emb / 1e6, 1),
            "embedding_share": round(emb / total, 3), "tied_lm_head": bool(tied)}


def fertility(tok, texts: dict[str, list[str]]) -> dict:
    out = {}
    eng_tokens = None
    for lang, rows in texts.items():
        tokens = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in rows)
        words = sum(len(t.split()) for t in rows)
        eng_tokens = tokens if lang == "eng" else eng_tokens
        out[lang] = {"tokens_per_word": round(tokens / words, 2),
                     "tokens_vs_english": round(tokens / eng_tokens, 2)}
    return out


def training_batch(tok, texts: list[str]) -> torch.Tensor:
    ids = []
    for t in texts:
        ids += tok(t + "\n\n", add_special_tokens=False)["input_ids"]
    need = SEQ_LEN * TRAIN_BATCH
    ids = (ids * (need // max(1, len(ids)) + 1))[:need]
    return torch.tensor(ids).view(TRAIN_BATCH, SEQ_LEN)


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo (the machine is shared: never plan past it)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def train_bytes(n_params: int, vocab: int, mode: str, with_adamw: bool) -> int:
    """Rough peak of one full fine-tuning step: weights, gradients, AdamW's two moments (in the
    weights' dtype), and the logits with their log-softmax and gradient (float32)."""
    w = 2 if mode.startswith("bf16") else 4
    per_param = w + w + (2 * w if with_adamw else 0) + (2 if mode == "fp32+autocast" else 0)
    return n_params * per_param + 3 * 4 * vocab * SEQ_LEN * TRAIN_BATCH + 2**30


def train_speed(ref: str, batch: torch.Tensor, mode: str, n_params: int, vocab: int) -> dict:
    """Seconds per 1k tokens of forward+backward and of the AdamW step, full fine-tuning.
    Without room for AdamW's moments (shared machine), forward+backward only."""
    gc.collect()
    avail = available_bytes()
    with_adamw = train_bytes(n_params, vocab, mode, True) < 0.8 * avail
    if not with_adamw and train_bytes(n_params, vocab, mode, False) >= 0.8 * avail:
        return {"skipped": f"needs ~{train_bytes(n_params, vocab, mode, False) / 2**30:.1f} GiB, "
                           f"{avail / 2**30:.1f} GiB available"}
    dtype = torch.bfloat16 if mode.startswith("bf16") else torch.float32
    model, _ = load_model(ref, dtype=dtype)
    model.train()
    if mode == "bf16, embeddings frozen":   # the tied embedding / LM head is not trained
        model.get_input_embeddings().weight.requires_grad_(False)
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=1e-5) if with_adamw else None
    fb, st = [], []
    for step in range(TRAIN_STEPS + 1):   # the first step warms up (allocations, AdamW state)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "fp32+autocast"):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        t1 = time.perf_counter()
        if opt is not None:
            opt.step()
        model.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        if step:
            fb.append(t1 - t0)
            st.append(t2 - t1)
    del model, opt
    gc.collect()
    k = batch.numel() / 1000
    return {"fwd_bwd_s_per_1k_tok": round(statistics.median(fb) / k, 2),
            "adamw_s_per_step": round(statistics.median(st), 2) if with_adamw else None,
            "loss": round(float(loss), 3)}


def generation_speed(model, tok, prompts: list[str]) -> float:
    """New tokens per second, greedy, batch GEN_BATCH, exactly GEN_TOKENS new tokens per row."""
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    enc = tok(prompts[:GEN_BATCH], return_tensors="pt", padding=True, add_special_tokens=False)
    kw = dict(max_new_tokens=GEN_TOKENS, min_new_tokens=GEN_TOKENS, do_sample=False,
              pad_token_id=tok.pad_token_id)
    with torch.inference_mode():
        model.generate(**enc, max_new_tokens=4, min_new_tokens=4, do_sample=False,
                       pad_token_id=tok.pad_token_id)   # warm-up
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            model.generate(**enc, **kw)
            times.append(time.perf_counter() - t0)
    return round(GEN_BATCH * GEN_TOKENS / statistics.median(times), 1)


def nll(model, tok, prompts: list[str], targets: list[str]) -> dict:
    """Teacher-forced NLL of targets after prompts: nats per token and per whitespace word."""
    per_token = gold_nll(model, tok, prompts, targets, batch_size=4)
    n_tok = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in targets]
    total = sum(m * n for m, n in zip(per_token, n_tok))
    words = sum(len(t.split()) for t in targets)
    return {"nats_per_token": round(total / sum(n_tok), 3), "nats_per_word": round(total / words, 3),
            "tokens": sum(n_tok), "words": words}


def heldout_nll(model, tok, items: dict[str, list[Item]]) -> dict:
    en = items["en"]
    solutions = nll(model, tok, [question_text(it, "en", True) for it in en],
                    [" " + target_text(it, "en", True) for it in en])
    sw = items["sw"]
    questions = nll(model, tok, [prompt_words("sw").question] * len(sw),
                    [" " + it.question for it in sw])
    return {"eng_worked_solutions": solutions, "swh_questions": questions}


def accuracy(model, tok, items: dict[str, list[Item]], shots: int, max_new_tokens: int) -> dict:
    """CoT accuracy with the library's prompts, exemplars, generation and extraction (flexible =
    last number). With 0 shots the question goes through the
    chat template where the tokenizer has one (SmolLM2-Instruct), plain otherwise (Gemma base)."""
    out = {}
    chat = not shots and bool(getattr(tok, "chat_template", None))
    for lang, its in items.items():
        t0 = time.perf_counter()
        exemplars = default_exemplars(its, shots, cot=True)
        prompts = [build_prompt(it, exemplars, cot=True, lang=lang, tokenizer=tok,
                                chat_template=chat) for it in its]
        gens = generate(model, tok, prompts, max_new_tokens=max_new_tokens,
                        stop=stop_strings(lang), batch_size=GEN_BATCH)
        ok = [is_correct(extract_answer(g.text, lang, True).flexible, it.answer)
              for g, it in zip(gens, its)]
        k = sum(ok)
        lo, hi = wilson_interval(k, len(its))
        out[lang] = {"n": len(its), "correct": k, "chat_template": chat, "accuracy": round(k / len(its), 3),
                     "ci95": [round(lo, 3), round(hi, 3)],
                     "new_tokens": sum(g.num_tokens for g in gens),
                     "seconds": round(time.perf_counter() - t0, 1),
                     "exemplars": [e.id for e in exemplars],
                     "example": {"question": its[0].question, "gold": its[0].answer,
                                 "output": gens[0].text[:400]}}
    return out


# --------------------------------------------------------------------------- driver
def bench_base(name: str, ref: str, args, texts, items) -> dict:
    r = {"ref": ref}
    t0 = time.perf_counter()
    folder = resolve(ref, progress=lambda m: log(m))
    r["prepare_s"] = round(time.perf_counter() - t0, 1)
    r["disk_MiB"] = round(sum(f.stat().st_size for f in folder.iterdir()) / 2**20)
    model, tok = load_model(ref, dtype=torch.float32)
    r["params"] = parameters(model)
    n_params, vocab = sum(p.numel() for p in model.parameters()), model.config.vocab_size
    r["fertility"] = fertility(tok, texts)
    log(f"{name}: params and fertility done")
    eval_dtype = torch.bfloat16 if args.eval_dtype == "bf16" else torch.float32
    prompts = [it.question for it in items["en"]]
    r["gen_tok_per_s"] = {"fp32": generation_speed(model, tok, prompts)}
    model = model.to(torch.bfloat16)
    r["gen_tok_per_s"]["bf16"] = generation_speed(model, tok, prompts)
    log(f"{name}: generation speed {r['gen_tok_per_s']}")
    model = model.to(eval_dtype)
    r["nll"] = heldout_nll(model, tok, items)
    log(f"{name}: NLL {r['nll']}")
    if not args.no_accuracy:
        r["accuracy"] = accuracy(model, tok, items, args.shots, args.max_new_tokens)
        log(f"{name}: accuracy { {k: v['accuracy'] for k, v in r['accuracy'].items()} }")
        if args.zero_shot:
            r["accuracy_0shot"] = accuracy(model, tok, items, 0, args.max_new_tokens)
            log(f"{name}: 0-shot accuracy "
                f"{ {k: v['accuracy'] for k, v in r['accuracy_0shot'].items()} }")
    del model
    if not args.no_train:
        batch = training_batch(tok, [target_text(it, "en", True) for it in items["en"]])
        r["train"] = {m: train_speed(ref, batch, m, n_params, vocab) for m in args.train_modes}
        log(f"{name}: training {r['train']}")
    return r


def train_cell(t: dict | None) -> str:
    if not t:
        return "-"
    if "skipped" in t:
        return f"skipped ({t['skipped']})"
    adamw = t["adamw_s_per_step"]
    return f"{t['fwd_bwd_s_per_1k_tok']}" + (f" (+{adamw} s AdamW/step)" if adamw is not None
                                             else " (no room for AdamW)")


def table(results: dict) -> str:
    names = list(results)
    rows = [("parameters (M), of which embedding", lambda r: f"{r['params']['total_M']} / "
             f"{r['params']['embedding_M']} ({r['params']['embedding_share']:.0%})"),
            ("cached model on disk (MiB)", lambda r: str(r["disk_MiB"]))]
    for lang in FERTILITY_LANGS:
        rows.append((f"tokens/word {lang} (x English tokens)", lambda r, lang=lang:
                     f"{r['fertility'][lang]['tokens_per_word']} "
                     f"(x{r['fertility'][lang]['tokens_vs_english']})"))
    rows.append(("generation tok/s, batch 8, fp32 / bf16", lambda r:
                 f"{r['gen_tok_per_s']['fp32']} / {r['gen_tok_per_s']['bf16']}"))
    for mode in TRAIN_MODES:
        rows.append((f"train fwd+bwd s/1k tok, {mode}", lambda r, mode=mode:
                     train_cell(r.get("train", {}).get(mode))))
    for key, label in (("accuracy", "few-shot"), ("accuracy_0shot", "0-shot")):
        for lang in EVAL_LANGS:
            rows.append((f"{label} CoT accuracy {lang} variants", lambda r, lang=lang, key=key:
                         f"{r[key][lang]['correct']}/{r[key][lang]['n']} "
                         f"[{r[key][lang]['ci95'][0]:.2f}, {r[key][lang]['ci95'][1]:.2f}]"
                         if key in r else "-"))
    for key, label in (("eng_worked_solutions", "NLL eng worked solutions"),
                       ("swh_questions", "NLL swh question text")):
        rows.append((f"{label}, nats/token; nats/word", lambda r, key=key:
                     f"{r['nll'][key]['nats_per_token']}; {r['nll'][key]['nats_per_word']}"))
    width = max(len(label) for label, _ in rows)
    lines = [f"| {'':{width}} | " + " | ".join(names) + " |",
             f"|{'-' * (width + 2)}|" + "|".join("-" * (len(n) + 2) for n in names) + "|"]
    for label, f in rows:
        lines.append(f"| {label:{width}} | " + " | ".join(f(results[n]) for n in names) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40, help="variants per evaluated language")
    ap.add_argument("--shots", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-dtype", choices=("fp32", "bf16"), default="bf16",
                    help="dtype for accuracy and NLL (bf16: ~8x faster matmuls on avx512_bf16)")
    ap.add_argument("--train-modes", nargs="+", default=list(TRAIN_MODES), choices=TRAIN_MODES)
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--zero-shot", action="store_true",
                    help="also 0-shot accuracy (chat template where the tokenizer has one)")
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--bases", nargs="+", default=list(BASES), choices=list(BASES))
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    texts = fertility_texts()
    items = {lang: variants(lang, args.n) for lang in EVAL_LANGS}
    log(f"data ready: {len(items['en'])} en, {len(items['sw'])} sw variants of "
        f"{len(eval_templates())} templates")
    results = {}
    for name in args.bases:
        results[name] = bench_base(name, BASES[name], args, texts, items)
        if args.json:
            args.json.write_text(json.dumps({"partial": True, "results": results},
                                            indent=1, ensure_ascii=False))
    meta = {"threads": args.threads, "eval_dtype": args.eval_dtype, "shots": args.shots,
            "seed": SEED, "templates": eval_templates(), "seq_len": SEQ_LEN,
            "train_batch": TRAIN_BATCH, "seconds": round(time.perf_counter() - t0)}
    print(table(results))
    out = {"meta": meta, "results": results}
    print(json.dumps(out, indent=1, ensure_ascii=False))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
