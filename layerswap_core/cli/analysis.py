"""`layerswap analyze` and `layerswap suggest`: where the experts changed, and a config from it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .progress import progress_bar
from . import HELP

if TYPE_CHECKING:   # annotations only: the module imports torch (see _stats)
    from ..analysis.deltas import DeltaStats


def _stats(base, expert, threshold, device, cache, label=None) -> DeltaStats:
    # lazy: analysis.deltas imports torch (1.3-1.5 s), not needed for --help
    from ..analysis.deltas import delta_stats

    with progress_bar(f"analyze {Path(str(expert)).name}", leave=False) as progress:
        return delta_stats(base, expert, threshold=threshold, device=device, progress=progress,
                           cache=cache, label=label)


def _print_profile(st: DeltaStats, tau: float):
    prof = st.layer_profile()
    top = prof.max() or 1.0
    print(f"{st.label}: {len(st.tensors)} tensors, threshold {tau:.3g}"
          + (" (cached)" if st.from_cache else f" ({st.seconds:.1f} s)"))
    _, _, frac = st.grid("frac_rows_above", tau)
    for l in range(st.num_layers):
        bar = "#" * int(round(30 * prof[l] / top))
        print(f"  layer {l:>3}  mass {prof[l]:10.4g}  rows>tau {np.nanmean(frac[l]):5.0%}  {bar}")


def _analyze(args) -> int:
    # lazy: analysis.deltas imports torch (1.3-1.5 s), not needed for --help
    from ..analysis.deltas import auto_threshold

    stats = [_stats(args.base, e, args.threshold, args.device, not args.no_cache)
             for e in args.expert]
    tau = args.threshold if args.threshold is not None else auto_threshold(*stats)
    for st in stats:
        _print_profile(st, tau)
    if args.out:
        out = Path(args.out)
        if out.suffix == ".json":
            docs = [json.loads(st.to_json(tau=tau)) for st in stats]
            out.write_text(json.dumps(docs[0] if len(docs) == 1 else docs, indent=1))
        elif out.suffix == ".csv":
            text = "".join(st.to_csv(tau=tau) if i == 0 else st.to_csv(tau=tau).split("\n", 1)[1]
                           for i, st in enumerate(stats))
            out.write_text(text)
        else:
            raise ValueError(f"--out {out}: use a .csv or .json file name")
        print(f"wrote {out}")
    return 0


def _suggest(args) -> int:
    # lazy: analysis.suggest imports torch (1.3-1.5 s), not needed for --help
    from ..analysis.suggest import suggest_config

    task = _stats(args.base, args.task, None, args.device, not args.no_cache, "task")
    lang = _stats(args.base, args.lang, None, args.device, not args.no_cache, "lang")
    s = suggest_config(task, lang, task.num_layers)
    print(f"suggested: bottom {s.bottom}, top {s.top}, transition bottom {s.transition_bottom}, "
          f"transition top {s.transition_top}, partition {s.partition or 'none'}")
    print()
    print(s.explanation)
    print()
    flags = (f"--partition {s.partition}" if s.partition else
             f"--bottom {s.bottom} --top {s.top} --transition-bottom {s.transition_bottom} "
             f"--transition-top {s.transition_top}")
    print(f"merge with: layerswap merge --task {args.task} --lang {args.lang} {flags} --out DIR")
    return 0


def add_cli(sub):
    p = sub.add_parser("analyze", help=HELP["analyze"])
    p.add_argument("--base", required=True, help="base model reference")
    p.add_argument("--expert", required=True, action="append",
                   help="expert model reference or LoRA adapter folder (repeatable)")
    p.add_argument("--threshold", type=float, help="row-MAV threshold tau (default: automatic)")
    p.add_argument("--out", help="write per-tensor statistics to a .csv or .json file")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    p.add_argument("--no-cache", action="store_true", help="recompute (and do not write the cache)")
    p.set_defaults(func=_analyze)
    p = sub.add_parser("suggest", help=HELP["suggest"])
    p.add_argument("--base", required=True)
    p.add_argument("--task", required=True, help="task (e.g. math) expert")
    p.add_argument("--lang", required=True, help="language expert")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-cache", action="store_true")
    p.set_defaults(func=_suggest)
