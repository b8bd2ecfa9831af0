"""Scoring one configuration, and the worker that does it on one engine.

An **engine** is a live model over a (base, task, language) trio (``merge.live.LiveModel``):
showing a configuration rewrites only the tensors whose source changed. ``engine_checkout`` lends
one from this process's engine pool (``engines.pool``), in this process or inside a Ray actor.

Scores come from the evaluation code as it is (``evaluation.runner.run_side_by_side``):
accuracy (flexible extract) with its 95% Wilson interval, or the mean gold-solution NLL
(teacher-forced, no generation: ``evaluation.runner.task_nll``) with a normal 95% interval over
the items.
"""
from __future__ import annotations

import math
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from ..checkpoints.loading import pick_device
from ..evaluation.registry import choices, load_items
from ..demos import variants as _demo_task  # noqa: F401  (registers the demo-variants task)
from ..merge.config import MergeConfig

METRICS = ("accuracy", "nll")


@dataclass(frozen=True)
class EvalSettings:
    """What a configuration is scored on, and how (plain data: goes into every result key)."""
    data: str = "gsm-symbolic"
    langs: tuple[str, ...] = ("sw",)
    n: int | None = 8
    shots: int = 0
    metric: str = "accuracy"
    cot: bool = False
    max_new_tokens: int | None = None
    batch_size: int = 16
    data_dir: str | None = None

    def check(self) -> EvalSettings:
        if self.data not in choices("sweep"):
            raise ValueError(f"data: one of {', '.join(choices('sweep'))}, not {self.data!r}")
        if self.metric not in METRICS:
            raise ValueError(f"metric: one of {', '.join(METRICS)}, not {self.metric!r}")
        if not self.langs:
            raise ValueError("give at least one language to score in (--langs)")
        if self.n is not None and self.n < 1:
            raise ValueError(f"n must be at least 1, not {self.n}")
        return self

    def key(self) -> dict:
        """The settings a score depends on (not the batch size or the data folder)."""
        d = asdict(self)
        d.pop("batch_size")
        d.pop("data_dir")
        d["langs"] = list(d["langs"])
        if self.metric == "nll":   # as when the NLL ran after one generated token: the keys
            d["max_new_tokens"] = 1   # of earlier results stay valid (same floats)
        return d

    def to_dict(self) -> dict:
        d = asdict(self)
        d["langs"] = list(self.langs)
        return d


def load_eval_items(settings: EvalSettings) -> dict[str, tuple[list, list]]:
    """language -> (items, exemplars) the sweep scores every configuration on."""
    # lazy: evaluation.runner imports torch (1.7-2.1 s), not needed by `sweep --help`
    from ..evaluation.runner import default_exemplars

    out = {}
    for lang in settings.langs:
        items = load_items(settings.data, lang, settings.n, data_dir=settings.data_dir)
        if settings.metric == "nll" and not all(it.solution for it in items):
            raise ValueError("gold NLL needs worked solutions: use gsm-symbolic or "
                             "demo-variants, or --metric accuracy")
        exemplars = default_exemplars(items, settings.shots, cot=settings.cot,
                                      data_dir=settings.data_dir)
        out[lang] = (items, exemplars)
    return out


def nll_interval(values: list[float], z: float = 1.96) -> tuple[float, float]:
    """Normal 95% interval of a mean over items (the items' spread; 0 width for one item)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean - z * sd / math.sqrt(n), mean + z * sd / math.sqrt(n)


def score_model(model, tokenizer, eval_items: dict, settings: EvalSettings,
                progress=None) -> dict[str, dict]:
    """language -> the score of (model, tokenizer) on that language's items."""
    # lazy: evaluation.runner imports torch (1.7-2.1 s), not needed by `sweep --help`
    from ..evaluation.runner import mean_nll, run_side_by_side, task_nll, task_record

    out = {}
    for lang, (items, exemplars) in eval_items.items():
        if settings.metric == "nll":   # teacher-forced: no generation
            per_item = task_nll(task_record(items, exemplars, cot=settings.cot), model,
                                tokenizer, batch_size=settings.batch_size, progress=progress)
            lo, hi = nll_interval(per_item)
            out[lang] = {"n": len(items), "nll": mean_nll(per_item), "ci_low": lo, "ci_high": hi}
            continue
        res = run_side_by_side({"merged": (model, tokenizer)}, items, exemplars=exemplars,
                               cot=settings.cot, batch_size=settings.batch_size, with_nll=False,
                               max_new_tokens=settings.max_new_tokens, progress=progress)
        s = res.summary[0]
        correct = sum(bool(r["models"]["merged"]["correct"]) for r in res.rows)
        out[lang] = {"n": s["n"], "correct": correct, "accuracy": s["accuracy"],
                     "ci_low": s["ci_low"], "ci_high": s["ci_high"],
                     "strict_accuracy": s["strict_accuracy"]}
    return out


# --------------------------------------------------------------------------- engines
def trio_for(refs: dict, device: str = "auto"):
    """The engine pool's key for a trio ``refs`` = {"task", "lang", "base"?} on ``device``."""
    # lazy: the engines (pool, jobs, dispatch) add 0.06-0.08 s to `layerswap`'s start (-X importtime)
    from ..engines.pool import Trio

    return Trio(refs["task"], refs["lang"], refs.get("base"), device=pick_device(device))


def engine_checkout(refs: dict, device: str = "auto"):
    """A checkout: ``with checkout() as engine`` lends a live model of this process's engine
    pool (``engines.dispatch.default().pool``: bounded, shared with anything else this process
    runs, kept between configurations) for one configuration."""
    # lazy: the engines (pool, jobs, dispatch) add 0.06-0.08 s to `layerswap`'s start (-X importtime)
    from ..engines.dispatch import default as default_dispatcher

    trio = trio_for(refs, device)

    @contextmanager
    def checkout():
        with default_dispatcher().pool.checkout(trio) as engine:
            yield engine.live
    return checkout


@dataclass
class SweepWorker:
    """Scores configurations on one engine (in this process, or as a Ray actor).

    ``run(job)`` takes plain data (key, point, the MergeConfig as a dict) and returns plain
    data: the job with its scores, seconds, tensors rewritten and this worker's name."""
    refs: dict
    settings: dict
    eval_items: dict
    device: str = "auto"
    threads: int | None = None
    name: str = "local"
    checkout: object = field(default=None, repr=False)

    def __post_init__(self):
        if self.threads:
            import torch
            torch.set_num_threads(self.threads)
        self._settings = EvalSettings(**{**self.settings, "langs": tuple(self.settings["langs"])})
        if self.checkout is None:
            self.checkout = engine_checkout(self.refs, self.device)

    def where(self) -> str:
        return f"{self.name} (pid {os.getpid()} on {socket.gethostname()})"

    def run(self, job: dict, progress=None) -> dict:
        t0 = time.perf_counter()
        config = MergeConfig.from_dict(job["config"])
        with self.checkout() as engine:
            shown = engine.show(config)
            scores = score_model(engine.model, engine.tokenizer, self.eval_items, self._settings,
                                 progress)
        return {"key": job["key"], "point": job["point"], "config": job["config"],
                "scores": scores, "seconds": round(time.perf_counter() - t0, 3),
                "rewritten": shown.rewritten, "worker": self.where()}
