"""`layerswap eval` against lm-eval's OWN command on the same local MGSM documents and exemplars.

    python bench/eval_vs_lmeval.py [--model REF] [--langs sw en] [--modes direct cot] [--n 32]
                                   [--shots 2] [--reps 2] [--batch-size 16] [--profile]

For every (language, mode) the bench writes one lm-eval task folder: lm-eval's installed
``mgsm_direct_<lang>`` / ``mgsm_native_cot_<lang>`` YAML (prompt template, stop strings, filters,
metric) with the documents read from local JSONL files (``dataset_path: json``) made from the
same MGSM rows and exemplars our runner uses (``evaluation.lmeval.mgsm_task_config``), few-shot
exemplars in order (``first_n``) and ``max_gen_toks`` matched to ours (32 direct, 256 CoT). It
then runs, alternating, each in its own process:
  lm_eval   ``lm_eval --model hf --model_args pretrained=FOLDER,dtype=float32 --tasks T
            --include_path DIR --num_fewshot K --batch_size B --log_samples`` (what users run)
  ours      ``layerswap eval --model FOLDER --data mgsm --lang L --n N --shots K [--cot]
            --batch-size B --max-new-tokens M --device cpu --out JSON``
(a plain Llama on the CPU, as the embedded SmolLM2, runs through ``inference.lean``: the same
logits as transformers' modules, without importing transformers; ``--transformers`` is not
passed) and reports whole-process wall time and CPU seconds (os.wait4), min and median, the ratio
lm_eval / ours, and the generations compared item by item (identical / differing).
``--profile`` runs ours once more under cProfile and prints where the time goes (the 25 most
expensive functions by cumulative and by own time).
Targets (issue #30): ours >= 3x faster than lm_eval on chain-of-thought and >= 2x on direct
answers, at identical outputs. The load of the machine (/proc/loadavg) is printed before and after.

``--where inproc`` (run by default after the whole-process runs) loads the model once in this
process and alternates lm-eval's ``simple_evaluate`` on its HF wrapper
(``evaluation.lmeval.run_lm_eval``, batch B) with our runner (``runner.run_side_by_side``,
batch B) on it: the evaluation alone, without start-up and loading; wall and CPU seconds
(``time.process_time``) and the outputs compared item by item as above. ``--where ablation``
runs ours alone with its features turned off one by one (``generate(packed=False,
lookahead=0, refill=False, share_prefix=False, split_prefill=False)``): what each buys,
outputs compared with all on.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def run_measured(cmd: list[str], env=None) -> dict:
    """Wall time and CPU seconds of one child process (os.wait4); RuntimeError if it fails."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    # communicate() reaped the child; its rusage is in RUSAGE_CHILDREN (difference below)
    return {"wall_s": wall, "rc": p.returncode, "stdout": out.decode(), "stderr": err.decode()}


def cpu_children() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def write_task(folder: Path, lang: str, cot: bool, n: int, shots: int, data_dir) -> tuple[str, int]:
    """An lm-eval task folder for (lang, mode) on local JSONL documents; (task name, max tokens)."""
    import yaml

    from layerswap_core.evaluation.data import load_mgsm
    from layerswap_core.evaluation.lmeval import mgsm_task_config
    from layerswap_core.evaluation.runner import default_exemplars

    items = load_mgsm(lang, data_dir)[:n]
    exemplars = default_exemplars(items, shots, cot=cot, data_dir=data_dir)
    max_tokens = 256 if cot else 32
    cfg = mgsm_task_config(lang, items, exemplars, cot=cot, max_gen_toks=max_tokens)
    docs = cfg.pop("custom_dataset")()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "test.jsonl", "w", encoding="utf-8") as f:
        for row in docs["test"]:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    # the exemplars inline (lm-eval's fewshot_config "samples"): a JSON train split beside the
    # test split would need one schema for both (the test documents' answer is null)
    cfg.update(dataset_path="json", dataset_kwargs={"data_files": {
        "test": str(folder / "test.jsonl")}},
        fewshot_config={"sampler": "first_n", "samples": [dict(r) for r in docs["train"]]})
    for key in ("dataset_name", "fewshot_split", "training_split"):
        cfg.pop(key, None)
    cfg.pop("num_fewshot", None)  # given on the command line, as users do
    (folder / f"{cfg['task']}.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True,
                                                              sort_keys=False))
    return cfg["task"], max_tokens


def lm_eval_outputs(out_dir: Path) -> list[str]:
    """The raw generations of lm_eval's --log_samples file, in document order."""
    files = sorted(out_dir.rglob("samples_*.jsonl"))
    if not files:
        return []
    by_doc: dict[int, str] = {}
    for line in files[-1].read_text(encoding="utf-8").splitlines():
        # one row per document AND filter (strict, flexible): the raw generation is the same
        r = json.loads(line)
        raw = r["resps"][0][0]
        if by_doc.setdefault(r["doc_id"], raw) != raw:
            raise SystemExit(f"lm_eval logged two generations for document {r['doc_id']}")
    return [by_doc[k] for k in sorted(by_doc)]


def compare_outputs(reference: list[str], ours: list[str], label: str) -> int:
    """How many generations are identical, item by item (exact strings); the differing pairs
    are printed. A different number of items is an error (the comparison would be meaningless)."""
    if len(reference) != len(ours):
        raise SystemExit(f"{label}: lm_eval gave {len(reference)} generations, ours {len(ours)}")
    same = 0
    for i, (x, y) in enumerate(zip(reference, ours)):
        if x == y:
            same += 1
        else:
            print(f"  {label} item {i} differs: lm_eval {x!r} / ours {y!r}")
    return same


def our_outputs(path: Path) -> list[str]:
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    return [next(iter(r["models"].values()))["output"] for r in rows]


def summary_line(label: str, times: dict[str, list[dict]], same: int, n_items: int) -> str:
    """One result line: min/median wall of each contender, the ratios of medians, identical."""
    med = {k: statistics.median(r["wall_s"] for r in v) for k, v in times.items()}
    cpu = {k: statistics.median(r["cpu_s"] for r in v) for k, v in times.items()}
    return (f"{label}: lm_eval {min(r['wall_s'] for r in times['lm_eval']):.1f}/"
            f"{med['lm_eval']:.1f} s (min/median), ours "
            f"{min(r['wall_s'] for r in times['ours']):.1f}/{med['ours']:.1f} s; "
            f"lm_eval/ours wall {med['lm_eval'] / med['ours']:.2f}x, CPU "
            f"{cpu['lm_eval'] / max(cpu['ours'], 1e-9):.2f}x; outputs identical {same}/{n_items}; "
            f"load {loadavg()}")


def whole_process(a, folder, lm_eval_bin: str, tmp: Path, lang: str, cot: bool) -> None:
    """Each contender as the command users run, alternating; wall and CPU of the child."""
    mode = "cot" if cot else "direct"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": str(ROOT)}
    task, max_tokens = write_task(tmp / f"task-{lang}-{mode}", lang, cot, a.n, a.shots, a.data_dir)
    cmds = {
        "lm_eval": [lm_eval_bin, "--model", "hf", "--model_args",
                    f"pretrained={folder},dtype=float32", "--tasks", task,
                    "--include_path", str(tmp / f"task-{lang}-{mode}"),
                    "--num_fewshot", str(a.shots), "--batch_size", str(a.batch_size),
                    "--device", "cpu", "--log_samples", "--output_path",
                    str(tmp / "lm_eval_out")],
        "ours": [sys.executable, "-m", "layerswap_core.cli", "eval", "--model",
                 str(folder), "--data", "mgsm", "--lang", lang, "--n", str(a.n),
                 "--shots", str(a.shots), *(["--cot"] if cot else []),
                 "--batch-size", str(a.batch_size), "--max-new-tokens",
                 str(max_tokens), "--device", "cpu", "--out", str(tmp / "ours.json"),
                 *(["--data-dir", a.data_dir] if a.data_dir else [])],
    }
    times: dict[str, list[dict]] = {k: [] for k in cmds}
    outputs: dict[str, list[str]] = {}
    for rep in range(a.reps):
        order = list(cmds) if rep % 2 == 0 else list(cmds)[::-1]   # alternate
        for name in order:
            shutil.rmtree(tmp / "lm_eval_out", ignore_errors=True)
            cpu0 = cpu_children()
            r = run_measured(cmds[name], env)
            r["cpu_s"] = cpu_children() - cpu0
            if r["rc"] != 0:
                print(f"{lang} {mode}: {name} failed ({r['rc']}):\n{r['stderr'][-1500:]}")
                raise SystemExit(1)
            times[name].append(r)
            outputs[name] = (lm_eval_outputs(tmp / "lm_eval_out") if name == "lm_eval"
                             else our_outputs(tmp / "ours.json"))
    same = compare_outputs(outputs["lm_eval"], outputs["ours"], f"{lang} {mode}")
    print(summary_line(f"whole process {lang} {mode:<6} n={a.n} {a.shots}-shot batch "
                       f"{a.batch_size}", times, same, len(outputs["ours"])), flush=True)
    if a.profile and lang == a.langs[0] and cot == (a.modes[0] == "cot"):
        profile_ours(cmds["ours"][3:], env)


def in_process(a, folder, lang: str, cot: bool, model_and_tokenizer) -> None:
    """lm-eval's ``simple_evaluate`` on its HF wrapper (``evaluation.lmeval.run_lm_eval``)
    against our runner (``runner.run_side_by_side``), the same loaded model, alternating:
    the evaluation itself, without start-up and loading."""
    from layerswap_core.evaluation.data import load_mgsm
    from layerswap_core.evaluation.lmeval import run_lm_eval
    from layerswap_core.evaluation.runner import default_exemplars, run_side_by_side

    mode = "cot" if cot else "direct"
    items = load_mgsm(lang, a.data_dir)[:a.n]
    exemplars = default_exemplars(items, a.shots, cot=cot, data_dir=a.data_dir)
    max_tokens = 256 if cot else 32
    model, tok = model_and_tokenizer

    def lm_eval_run() -> list[str]:
        out = run_lm_eval(model, tok, lang, items=items, exemplars=exemplars, cot=cot,
                          batch_size=a.batch_size, max_gen_toks=max_tokens)
        by_doc = {s["doc_id"]: s["resps"][0][0] for s in out["samples"]}   # a row per filter
        return [by_doc[k] for k in sorted(by_doc)]

    def ours_run() -> list[str]:
        res = run_side_by_side({"model": (model, tok)}, items, exemplars=exemplars, cot=cot,
                               max_new_tokens=max_tokens, batch_size=a.batch_size,
                               with_nll=False)
        return [r["models"]["model"]["output"] for r in res.rows]

    runs = {"lm_eval": lm_eval_run, "ours": ours_run}
    times: dict[str, list[dict]] = {k: [] for k in runs}
    outputs: dict[str, list[str]] = {}
    for rep in range(a.reps):
        order = list(runs) if rep % 2 == 0 else list(runs)[::-1]
        for name in order:
            t0, c0 = time.perf_counter(), time.process_time()
            outputs[name] = runs[name]()
            times[name].append({"wall_s": time.perf_counter() - t0,
                                "cpu_s": time.process_time() - c0})
    same = compare_outputs(outputs["lm_eval"], outputs["ours"], f"{lang} {mode} in process")
    print(summary_line(f"in process    {lang} {mode:<6} n={a.n} {a.shots}-shot batch "
                       f"{a.batch_size}", times, same, len(outputs["ours"])), flush=True)


ABLATIONS = {   # generate() switches, each turning off one more of our features
    "all on": {},
    "no packed products": {"packed": False},
    "no packing, no lookahead": {"packed": False, "lookahead": 0},
    "no lookahead, no refill": {"packed": False, "lookahead": 0, "refill": False},
    "no refill, no shared prefix": {"packed": False, "refill": False, "share_prefix": False},
    "padded batch (no split prompt pass)": {"packed": False, "refill": False,
                                            "share_prefix": False, "split_prefill": False},
}


def ablation(a, lang: str, cot: bool, model_and_tokenizer) -> None:
    """What each of our features buys: ``generate`` on the task's prompts with the features
    turned off one by one (alternating order), min/median wall, outputs against all on."""
    from layerswap_core.evaluation.data import load_mgsm
    from layerswap_core.inference.generation import generate
    from layerswap_core.evaluation.runner import default_exemplars, side_by_side_task

    model, tok = model_and_tokenizer
    items = load_mgsm(lang, a.data_dir)[:a.n]
    task = side_by_side_task(items, default_exemplars(items, a.shots, cot=cot,
                                                      data_dir=a.data_dir), cot=cot)
    prompts = task.prompts(tok)
    times: dict[str, list[float]] = {k: [] for k in ABLATIONS}
    texts: dict[str, list[str]] = {}
    for rep in range(a.reps):
        for name in (list(ABLATIONS) if rep % 2 == 0 else list(ABLATIONS)[::-1]):
            t0 = time.perf_counter()
            gens = generate(model, tok, prompts, max_new_tokens=task.max_new_tokens,
                            stop=task.stop, batch_size=a.batch_size, **ABLATIONS[name])
            times[name].append(time.perf_counter() - t0)
            texts[name] = [g.text for g in gens]
    base = statistics.median(times["all on"])
    for name, ts in times.items():
        same = sum(x == y for x, y in zip(texts[name], texts["all on"]))
        print(f"  ablation {lang} {'cot' if cot else 'direct'} n={a.n}: {name:<36} "
              f"{min(ts):.1f}/{statistics.median(ts):.1f} s (x{statistics.median(ts) / base:.2f} "
              f"of all on); outputs as all on {same}/{len(prompts)}; load {loadavg()}",
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model reference (default: the embedded base)")
    ap.add_argument("--langs", nargs="+", default=["sw", "en"])
    ap.add_argument("--modes", nargs="+", default=["direct", "cot"], choices=["direct", "cot"])
    ap.add_argument("--where", nargs="+", default=["whole", "inproc"],
                    choices=["whole", "inproc", "ablation"],
                    help="whole: each tool's own command in its own process; inproc: both on "
                         "one model loaded once in this process; ablation: ours with its "
                         "features turned off one by one (generate's switches)")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--shots", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--profile", action="store_true", help="profile one run of ours (cProfile)")
    a = ap.parse_args()

    from layerswap_core.checkpoints.references import DEFAULT_BASE, resolve
    lm_eval_bin = shutil.which("lm_eval") or str(Path(sys.executable).parent / "lm_eval")
    if not Path(lm_eval_bin).exists():
        raise SystemExit("lm_eval is not installed (pip install lm-eval): nothing to compare")
    folder = resolve(a.model or DEFAULT_BASE)
    print(f"model {folder}; date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"{os.cpu_count()} CPUs; load average before: {loadavg()}", flush=True)
    loaded = None
    if "inproc" in a.where or "ablation" in a.where:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        from layerswap_core.checkpoints.loading import load_model
        loaded = load_model(str(folder), device="cpu")
    with tempfile.TemporaryDirectory(prefix="layerswap-eval-vs-lmeval-") as tmp:
        for lang in a.langs:
            for mode in a.modes:
                if "whole" in a.where:
                    whole_process(a, folder, lm_eval_bin, Path(tmp), lang, mode == "cot")
                if "inproc" in a.where:
                    in_process(a, folder, lang, mode == "cot", loaded)
                if "ablation" in a.where:
                    ablation(a, lang, mode == "cot", loaded)
    print(f"load average after: {loadavg()}")


def profile_ours(argv: list[str], env: dict):
    """Run ``layerswap eval`` in this process under cProfile; print the top functions."""
    os.environ.update({k: v for k, v in env.items() if k.startswith("HF_")})
    from layerswap_core.cli import main as cli_main
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.runcall(cli_main, argv)
    print(f"\nprofile of ours ({time.perf_counter() - t0:.1f} s in process):")
    stats = pstats.Stats(prof)
    stats.sort_stats("cumulative").print_stats(25)
    stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
