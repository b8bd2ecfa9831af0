"""The order a sweep visits its configurations in, and what each order costs in tensors
rewritten on a live model (``MergePlan.changed_names`` between consecutive plans).

* **row-major**: the grid as written (the last axis fastest); at the end of each row every
  last-axis change is undone at once;
* **snake**: boustrophedon over the grid (every other row reversed, at every level), so
  consecutive cells differ by one step on one axis;
* **nearest**: greedy nearest neighbour by the number of tensors whose source differs (any
  configurations, any methods);
* **auto**: the cheaper of snake and nearest (snake on ties).

Each worker gets a contiguous run of the order (``chunks``); its first configuration is
rewritten against what its engine showed before (the task expert: ``live.role_plan``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..merge.plan import MergePlan

ORDERS = ("auto", "snake", "nearest", "row-major")


def plan_codes(plans: list[MergePlan], start: MergePlan | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """One row per plan, one int per tensor: equal ints = the same ``Source`` (so counting
    differing columns counts the tensors one plan rewrites after the other)."""
    ids: dict = {}
    names = list(plans[0].sources) if plans else []

    def row(plan):
        return [ids.setdefault(plan.sources.get(n), len(ids)) for n in names]
    codes = np.array([row(p) for p in plans], dtype=np.int64).reshape(len(plans), len(names))
    return codes, (None if start is None else np.array(row(start), dtype=np.int64))


def rewrites(codes: np.ndarray, order: list[int], start: np.ndarray | None = None) -> int:
    """Tensors rewritten visiting ``order`` on one engine that first showed ``start`` (None: the
    first configuration is written in full)."""
    if not order:
        return 0
    first = codes[order[0]]
    total = int(first.size if start is None else (first != start).sum())
    seq = codes[order]
    return total + int((seq[1:] != seq[:-1]).sum())


def snake(indices: list[tuple[int, ...]]) -> list[int]:
    """Positions of ``indices`` (grid coordinates) in boustrophedon order: every axis reversed
    whenever the sum of the coordinates before it is odd."""
    def key(ix):
        out, flip = [], 0
        for i in ix:
            out.append(-i if flip % 2 else i)
            flip += i
        return out
    return sorted(range(len(indices)), key=lambda k: key(indices[k]))


def nearest(codes: np.ndarray, first: int = 0) -> list[int]:
    """Greedy nearest neighbour by tensors changed, from ``first`` (ties: grid order)."""
    n = len(codes)
    if n == 0:
        return []
    left = np.ones(n, dtype=bool)
    order = [first]
    left[first] = False
    for _ in range(n - 1):
        cost = (codes != codes[order[-1]]).sum(1)
        cost[~left] = np.iinfo(np.int64).max
        nxt = int(np.argmin(cost))
        order.append(nxt)
        left[nxt] = False
    return order


def chunks(order: list, workers: int) -> list[list]:
    """``order`` cut into ``workers`` contiguous runs of near-equal length (none empty)."""
    workers = max(1, min(workers, len(order)))
    size, extra = divmod(len(order), workers)
    out, i = [], 0
    for w in range(workers):
        j = i + size + (1 if w < extra else 0)
        out.append(order[i:j])
        i = j
    return out


@dataclass
class OrderReport:
    """The order chosen and what it and the others cost (tensors rewritten)."""
    name: str
    order: list[int]
    tensors: int                 # per configuration
    costs: dict[str, int]        # order name -> tensors rewritten on one engine
    workers_cost: int            # the chosen order cut into the workers' runs

    def text(self) -> str:
        c = self.costs
        parts = [f"{k} {v}" for k, v in c.items() if k != self.name]
        return (f"order: {self.name}, {c[self.name]} tensors rewritten on one engine "
                f"({'; '.join(parts)})")


def choose_order(codes: np.ndarray, indices: list[tuple[int, ...]], how: str = "auto",
                 start: np.ndarray | None = None, workers: int = 1) -> OrderReport:
    """The order ``how`` (``ORDERS``) and the costs of every order, for reporting."""
    if how not in ORDERS:
        raise ValueError(f"order: one of {', '.join(ORDERS)}, not {how!r}")
    n = len(codes)
    candidates = {"snake": snake(indices), "row-major": list(range(n))}
    candidates["nearest"] = nearest(codes, candidates["snake"][0] if n else 0)
    costs = {k: rewrites(codes, v, start) for k, v in candidates.items()}
    costs["reloading"] = n * (codes.shape[1] if n else 0)
    name = how if how != "auto" else min(("snake", "nearest"), key=lambda k: costs[k])
    order = candidates[name]
    workers_cost = sum(rewrites(codes, run, start) for run in chunks(order, workers))
    return OrderReport(name, order, codes.shape[1] if n else 0, costs, workers_cost)
