"""`layerswap sweep`: a grid of merge configurations scored on one process or on Ray actors,
resumable from DIR/results.jsonl (the library: ``sweeps.runner.run_sweep``)."""
from __future__ import annotations

from ..sweeps import report
from ..sweeps.grid import parse_grid
from ..sweeps.order import ORDERS
from ..sweeps.backends import BACKENDS
from ..sweeps.runner import SweepRequest, run_sweep
from ..evaluation.registry import choices
from ..demos import variants as _demo_task  # noqa: F401  (registers the demo-variants task)
from ..sweeps.scoring import METRICS, EvalSettings
from .merge import MODEL_FIELDS, add_config_flags, config_from_args
from . import HELP


def _langs(text: str) -> tuple[str, ...]:
    langs = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not langs:
        raise ValueError("--langs: give at least one language, e.g. sw,en")
    return langs


def request_from_args(args) -> SweepRequest:
    if not args.task or not args.lang:
        raise ValueError("give the experts: --task T --lang L (and --base B for methods that "
                         "need it)")
    fixed = config_from_args(args)
    grid = parse_grid(args.grid, fixed.method)
    settings = EvalSettings(args.data, _langs(args.langs), args.n, args.shots, args.metric,
                            args.cot, args.max_new_tokens, args.batch_size, args.data_dir).check()
    config = {k: v for k, v in fixed.to_dict().items() if k not in MODEL_FIELDS}
    options = {}
    if args.backend == "ray":
        options = dict(address=args.address, workers=args.workers,
                       gpus_per_worker=args.gpus_per_worker, cpus_per_worker=args.cpus_per_worker)
    elif args.workers != 1 or args.address:
        raise ValueError("--workers and --address are for --backend ray (local runs one worker)")
    return SweepRequest(args.task, args.lang, grid, args.base, config, settings, args.out,
                        args.order, args.backend, options, args.device)


def _sweep(args) -> int:
    from tqdm import tqdm

    request = request_from_args(args)
    workers = request.backend_options.get("workers", 1)
    bars = []

    def on_start(outcome, todo: int):
        order, impossible = outcome.order, outcome.impossible
        print(f"{len(outcome.cells)} configurations"
              + (f" ({len(impossible)} impossible cells skipped: {impossible[0][1]})"
                 if impossible else "") + f"; {outcome.reused} done already; {order.text()}"
              + (f"; cut into {workers} runs: {order.workers_cost}" if workers > 1 else ""),
              flush=True)
        bars.append(tqdm(total=todo, unit="config", desc="configurations", dynamic_ncols=True))

    def on_result(record):
        bars[0].update(1)
        bars[0].set_postfix_str(report.point_text(record["point"]), refresh=False)

    print("reading the models' headers and the items; fingerprinting the models", flush=True)
    try:
        outcome = run_sweep(request, on_start=on_start, on_result=on_result, limit=args.limit)
    finally:
        for bar in bars:
            bar.close()
    print(f"{outcome.scored} scored now, {outcome.reused} found done in "
          f"{request.out}/results.jsonl" + ("" if outcome.complete else
                                            f"; {len(outcome.cells) - len(outcome.results)} "
                                            "left (run the same command again to go on)"))
    records = outcome.records()
    langs, metric = list(request.eval.langs), request.eval.metric
    print(report.table(records, list(request.grid), langs, metric))
    for line in report.best_lines(records, langs, metric):
        print(line)
    if records:
        for path in report.write_heatmap(records, request.grid, langs, metric, request.out):
            print(f"wrote {path}")
    return 0


def add_cli(subparsers) -> None:
    s = subparsers.add_parser(
        "sweep", help=HELP["sweep"],
        description="Every configuration of the grid is shown on a live model (only the tensors "
        "that change are rewritten, in an order that changes the fewest) and scored; each "
        "result is appended to OUT/results.jsonl at once, and running the same command again "
        "skips what is done.")
    add_config_flags(s)
    g = s.add_argument_group("grid")
    g.add_argument("--grid", nargs="+", required=True, metavar="FIELD=VALUES",
                   help="axes, e.g. bottom=3,4,5 top=0,1,2 (any numeric merge field of the "
                   "method: transition_bottom, transition_top, transition (both), w_task, "
                   "lambda_task, ...; counts also as ranges 0-4 or 0-8:2)")
    g.add_argument("--order", choices=ORDERS, default="auto",
                   help="visiting order (auto: the cheaper of snake and nearest neighbour)")
    g = s.add_argument_group("scoring")
    g.add_argument("--data", choices=choices("sweep"), default="gsm-symbolic",
                   help="items: MGSM, GSM-Symbolic (templates 0050-0099) or the demo's "
                   "validation variants")
    g.add_argument("--data-dir", default=None, help="folder of mgsm_<lang>.tsv files")
    g.add_argument("--langs", default="sw", help="languages to score in, e.g. sw,en")
    g.add_argument("--n", type=int, default=8, help="items per language (default 8)")
    g.add_argument("--shots", type=int, default=0, help="few-shot exemplars, 0-8")
    g.add_argument("--metric", choices=METRICS, default="accuracy",
                   help="accuracy (greedy generation, 95%% Wilson interval) or nll (mean "
                   "gold-solution NLL, one forward pass per item)")
    g.add_argument("--cot", action="store_true", help="chain-of-thought prompts")
    g.add_argument("--max-new-tokens", type=int, default=None,
                   help="default: 32 direct, 256 chain-of-thought")
    g.add_argument("--batch-size", type=int, default=16)
    g = s.add_argument_group("where")
    g.add_argument("--out", required=True, help="folder of sweep.yaml, results.jsonl, heatmap")
    g.add_argument("--backend", choices=[b for b in BACKENDS if b in ("local", "ray")],
                   default="local", help="; ".join(f"{b.name}: {b.description}"
                                                   for b in BACKENDS.values()
                                                   if b.name in ("local", "ray")))
    g.add_argument("--address", default=None,
                   help="Ray cluster: auto or HOST:PORT of `ray start --head` (default: a new "
                   "local Ray runtime)")
    g.add_argument("--workers", type=int, default=1, help="Ray actors, each with one engine")
    g.add_argument("--gpus-per-worker", type=float, default=0.0,
                   help="GPUs per actor (e.g. 1, or 0.5 for two small engines per GPU)")
    g.add_argument("--cpus-per-worker", type=float, default=1.0,
                   help="CPUs per actor (also its torch threads)")
    g.add_argument("--device", default="auto", help="local backend: cpu, cuda or auto")
    g.add_argument("--limit", type=int, default=None,
                   help="score at most N configurations now (rerun to go on)")
    s.set_defaults(func=_sweep)



