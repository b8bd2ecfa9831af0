"""Pick a cross-fitting run's checkpoint by the shipped experts' own rules (issue #62), never
on evaluated items:

* a math expert (``--math RUN``): the lowest mean NLL per response token of the 13 original
  English statements, with their worked solutions, of the templates that have no variants
  (``demos.variants.SLOW_TEMPLATES | UNPAIRED_TEMPLATES``: no fold trains on or
  evaluates them, none is an MGSM item), i.e. math on unseen templates (the shipped math
  expert's card: base 1.478, its checkpoint 28 1.068);
* a language expert (``--lang RUN``): the lowest reading proxy the trainer measured
  (``eval_losses`` of the run's ``training_log.json``, every 4 steps).

    python bench/demo_fold_checkpoints.py --math /work/runs/fold2-math [--threads 1] [--json OUT]
    python bench/demo_fold_checkpoints.py --lang /work/runs/fold2-swahili

RUN is a `bench/demo_folds.py` run folder (its ``out/`` holds ``checkpoint-N`` folders and the
final adapter, which is step ``steps``).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def unseen_rows() -> list[dict]:
    from layerswap_core.demos.variants import SLOW_TEMPLATES, UNPAIRED_TEMPLATES
    from layerswap_core.training.recipes import chat_row, read_template

    rows = []
    for t in sorted(SLOW_TEMPLATES | UNPAIRED_TEMPLATES):   # as the math expert trains: the
        tpl = read_template("eng", t)                       # calculator notes kept
        rows.append(chat_row(tpl["question"].strip(), tpl["answer"].strip(),
                             f"gsm-symbolic-original {t:04d}"))
    return rows


def checkpoints(run: Path) -> dict[int, Path]:
    out = run / "out"
    found = {int(p.name.removeprefix("checkpoint-")): p for p in out.glob("checkpoint-*")
             if (p / "adapter_model.safetensors").is_file()}
    log = out / "training_log.json"
    if log.is_file() and (out / "adapter_model.safetensors").is_file():
        found[json.loads(log.read_text())["steps"]] = out
    return dict(sorted(found.items()))


def pick_math(run: Path, threads: int = 1) -> dict:
    import torch

    from layerswap_core.checkpoints.adapters import apply_adapter
    from layerswap_core.checkpoints.loading import load_model
    from layerswap_core.checkpoints.references import resolve
    from layerswap_core.training.sft_data import heldout_nll

    torch.set_num_threads(threads)
    rows = unseen_rows()
    base = json.loads((run / "out" / "training_log.json").read_text())["config"]["model"]
    table = {}
    with tempfile.TemporaryDirectory() as tmp:
        for step, folder in [(0, base), *checkpoints(run).items()]:
            # an adapter is measured over its base (bf16, as an embedded expert is built)
            ref = base if step == 0 else str(apply_adapter(resolve(base), folder,
                                                           Path(tmp) / f"step{step}"))
            model, tok = load_model(ref, device="cpu")
            table[step] = heldout_nll(model, rows, tokenizer=tok, max_length=512)
            print(f"step {step}: {table[step]:.3f}", flush=True)
            del model
            if step:
                shutil.rmtree(ref)
    best = min((s for s in table if s), key=table.get)
    return {"rule": "unseen-template originals (13)", "nll": table, "chosen": best,
            "folder": str(checkpoints(run)[best])}


def pick_lang(run: Path) -> dict:
    log = json.loads((run / "out" / "training_log.json").read_text())
    have = checkpoints(run)
    proxy = {e["step"]: e["loss"] for e in log["eval_losses"]}
    best = min((s for s in proxy if s in have), key=proxy.get)
    return {"rule": "reading proxy (trainer's eval_losses)", "nll": proxy, "chosen": best,
            "folder": str(have[best])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--math", type=Path, help="a math expert's run folder")
    ap.add_argument("--lang", type=Path, help="a language expert's run folder")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write the table and the choice here")
    args = ap.parse_args(argv)
    if not (args.math or args.lang):
        ap.error("give --math RUN or --lang RUN")
    t0 = time.time()
    res = pick_math(args.math, args.threads) if args.math else pick_lang(args.lang)
    print(" | ".join(f"{s}: {v:.3f}" for s, v in res["nll"].items()))
    print(f"chosen: step {res['chosen']} ({res['folder']}) by {res['rule']}, "
          f"{time.time() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
