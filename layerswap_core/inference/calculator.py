"""A GSM8K-style calculator for greedy decoding.

GSM8K's worked solutions mark each arithmetic step as ``<<expr=result>>`` ("4*80=<<4*80=320>>320
kernels"), and the GSM8K paper (Cobbe et al., 2021) decoded with a calculator: once the model has
written ``<<expr=``, the result and the closing ``>>`` are filled in. The model still has to read
the problem and choose every expression; only the arithmetic is exact. The demo's math expert
learns this format (its worked solutions keep the notes), and the demo scores every model with
the calculator on, so the comparison between models is about the method, not about a 135M
model's multiplication.

``Calculator.next_token`` says which token must come next (or None: the model's own pick), from
the text generated so far. Expressions are evaluated with a whitelist (numbers, + - * /, unary
minus, parentheses); anything else leaves the model alone.
"""
from __future__ import annotations

import ast
import operator
import re

__all__ = ["TAIL", "Calculator", "completion", "evaluate", "number_text"]

TAIL = 64          # tokens decoded to find an open note (a note is far shorter)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv}
_CLEAN = re.compile(r"[,$€£%\s]")


def evaluate(expr: str) -> float | None:
    """The value of an arithmetic expression (numbers, + - * /, parentheses), else None."""
    text = _CLEAN.sub("", expr)
    if not text or len(text) > 200:
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return None

    def ev(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("not arithmetic")

    try:
        value = float(ev(tree))
    except (ValueError, ZeroDivisionError, OverflowError, TypeError):
        return None
    return value if abs(value) < 1e15 else None


def number_text(value: float) -> str:
    """A result as GSM8K writes it: an integer without a point, else up to 6 decimals."""
    if abs(value - round(value)) < 1e-9:
        return str(int(round(value)))
    return f"{value:.6f}".rstrip("0").rstrip(".")


def completion(text: str) -> str | None:
    """What must follow ``text`` to close its open ``<<expr=`` note with the right result
    (the part of ``result>>`` not yet written), or None when no note is open, the expression is
    not arithmetic, or the model already wrote something else after ``=``."""
    start = text.rfind("<<")
    if start < 0 or ">>" in text[start:]:
        return None
    expr, eq, written = text[start + 2:].partition("=")
    if not eq:
        return None
    value = evaluate(expr)
    if value is None:
        return None
    target = number_text(value) + ">>"
    if not target.startswith(written) or written == target:
        return None
    return target[len(written):]


class Calculator:
    """Forces the result of each ``<<expr=`` note during greedy decoding (module docstring)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._ids: dict[str, int] = {}

    def next_token(self, new_tokens: list[int]) -> int | None:
        """The token that must come next after ``new_tokens`` (the generated ones), or None."""
        if not new_tokens:
            return None
        rest = completion(self.tokenizer.decode(new_tokens[-TAIL:], skip_special_tokens=True))
        if rest is None:
            return None
        if rest not in self._ids:
            ids = self.tokenizer.encode(rest, add_special_tokens=False)
            self._ids[rest] = ids[0] if ids else -1
        return self._ids[rest] if self._ids[rest] >= 0 else None

    def logits_processor(self, prompt_width: int):
        """The same as a transformers logits processor (for ``model.generate``): rows whose next
        token is forced get every other token's score set to -inf."""
        import torch

        def process(input_ids, scores):
            for row in range(input_ids.shape[0]):
                t = self.next_token(input_ids[row, prompt_width:].tolist())
                if t is not None:
                    forced = scores[row, t].clone()
                    scores[row] = float("-inf")
                    scores[row, t] = forced if torch.isfinite(forced) else 0.0
            return scores
        return process
