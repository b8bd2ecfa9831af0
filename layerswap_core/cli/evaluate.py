"""`layerswap eval`: models side by side on MGSM or GSM-Symbolic (or through lm-eval itself)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..evaluation.data import MGSM_HUB_ID, DataError
from ..evaluation.registry import choices, load_items, task_spec, training_overlap
from ..demos import variants as _demo_task  # noqa: F401  (registers the demo-variants task)
from ..checkpoints.references import ModelLoadError, resolve
from ..checkpoints.loading import load_model
from .progress import progress_bar
from . import HELP


def _training_overlap(refs, items) -> None:
    """Which evaluated templates each model's card says it was trained on (the statement the
    app's evaluation note makes: ``registry.training_overlap``)."""
    for ref in refs:
        try:
            folder = resolve(ref)
        except ModelLoadError:
            continue   # loading it reports the problem
        said = training_overlap(ref, folder, items)
        if said:
            print(("note: " if said.clean else "warning: ") + said.text, file=sys.stderr)


def _lm_eval(args, items, exemplars) -> int:
    """The same items through lm-eval's own mgsm task (its prompts, filters and metric)."""
    # lazy: evaluation.lmeval imports torch (1.7-2.1 s), not needed for --help
    from ..evaluation.lmeval import run_lm_eval

    if not task_spec(args.data).lm_eval:
        raise ValueError("--lm-eval runs lm-eval's mgsm tasks: use it with --data mgsm")
    out = {}
    for ref in args.model:
        model, tok = load_model(ref, device=args.device)
        res = run_lm_eval(model, tok, args.lang, items=items, exemplars=exemplars, cot=args.cot,
                          data_dir=args.data_dir, batch_size=args.batch_size,
                          max_gen_toks=args.max_new_tokens, apply_chat_template=args.chat_template)
        del model
        metrics = {k: float(v) for k, v in res["metrics"].items()
                   if k.startswith("exact_match,") and not isinstance(v, str)}
        out[ref] = {"task": res["task"], "metrics": metrics, "exemplars": res["exemplars"],
                    "samples": [{"doc_id": s["doc_id"], "filter": s["filter"], "target": s["target"],
                                 "resps": s["resps"], "filtered_resps": s["filtered_resps"],
                                 "exact_match": s["exact_match"]} for s in res["samples"]]}
        print(f"{ref}: lm-eval {res['task']} (n={len(items)}, {len(res['exemplars'])}-shot): "
              + ", ".join(f"{k.split(',')[1]} {v:.3f}" for k, v in metrics.items()))
    if args.out:
        Path(args.out).write_text(json.dumps(out, ensure_ascii=False, indent=1, default=str))
        print(f"wrote {args.out}")
    return 0


def _eval(args) -> int:
    if args.n is not None and args.n < 1:
        raise ValueError(f"--n must be at least 1 (leave it out for all items), not {args.n}")
    # lazy: evaluation.runner imports torch (1.7-2.1 s), not needed for --help
    from ..evaluation.runner import default_exemplars, run_side_by_side

    for ref in args.model:   # a missing or mistyped model is said before the data is looked for
        resolve(ref)
    try:
        items = load_items(args.data, args.lang, args.n, data_dir=args.data_dir, hub=args.hub)
    except DataError as e:
        if args.data != "mgsm" or "MGSM is not on this machine" not in str(e):
            raise
        raise DataError(f"{e}; or evaluate GSM-Symbolic, which is installed: --data "
                        "gsm-symbolic") from None
    exemplars = default_exemplars(items, args.shots, cot=args.cot, data_dir=args.data_dir,
                                  hub=args.hub)
    _training_overlap(args.model, items)
    if args.lm_eval:
        return _lm_eval(args, items, exemplars)
    names = {}
    for ref in args.model:   # short unique display names for the table
        name = Path(ref).name if Path(ref).exists() else ref
        names[name if name not in names else ref] = ref
    with progress_bar() as progress:
        result = run_side_by_side(names, items, exemplars=exemplars, cot=args.cot,
                                  chat_template=args.chat_template,
                                  max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                  data_dir=args.data_dir, device=args.device,
                                  lean=not args.transformers, progress=progress)
    c = result.config
    print(f"{c['data']} {c['lang']}: n={c['n']}, {c['shots']}-shot ({c['exemplar_source']}), "
          f"{c['format']}{', chat template' if c['chat_template'] else ''} (accuracy: flexible "
          f"extract; strict: lm-eval strict-match)")
    print(result.table())
    if args.out:
        print(f"wrote {result.save(args.out)}")
    return 0


def add_cli(subparsers) -> None:
    s = subparsers.add_parser("eval", help=HELP["eval"],
                              description="Greedy n-shot math evaluation with lm-eval's mgsm "
                              "prompts and filters; accuracy with a 95% Wilson interval.")
    s.add_argument("--model", action="append", required=True,
                   help="model reference (folder, embedded:NAME, owner/name); repeat for up to 4")
    s.add_argument("--data", choices=choices("eval"), default="mgsm")
    s.add_argument("--data-dir", default=None,
                   help="folder of mgsm_<lang>.tsv files (default: $LAYERSWAP_MGSM_DIR, else "
                   "the copy downloaded from the Hub into the cache on first use)")
    s.add_argument("--hub", action="store_true",
                   help=f"MGSM from the Hugging Face Hub ({MGSM_HUB_ID}; needs the network)")
    s.add_argument("--lang", default="sw", help="language code (sw, bn, te, en, ... or swh, ben)")
    s.add_argument("--n", type=int, default=None,
                   help="evaluate only the first N items (default: all; MGSM has 250)")
    s.add_argument("--shots", type=int, default=2,
                   help="few-shot exemplars, 0-8. MGSM: the benchmark's own exemplars, first N in "
                   "order (8: the layer-swapping paper's setting, 2: its follow-up's); "
                   "GSM-Symbolic: training templates")
    s.add_argument("--cot", action="store_true", help="chain-of-thought prompts (else direct)")
    s.add_argument("--chat-template", action="store_true",
                   help="wrap the prompt in the model's chat template (exemplars as turns)")
    s.add_argument("--max-new-tokens", type=int, default=None,
                   help="default: 32 direct, 256 chain-of-thought")
    s.add_argument("--batch-size", type=int, default=16)
    s.add_argument("--device", default="auto", help="cpu, cuda or auto")
    s.add_argument("--lm-eval", action="store_true",
                   help="run lm-eval's own mgsm task (simple_evaluate, local data) instead")
    s.add_argument("--transformers", action="store_true",
                   help="load every model with transformers' own modules (by default a plain "
                        "Llama on the CPU runs through layerswap's lean forward, without "
                        "importing transformers: the same logits, a faster start)")
    s.add_argument("--out", default=None, help="write per-item rows and summary as JSON")
    s.set_defaults(func=_eval)
