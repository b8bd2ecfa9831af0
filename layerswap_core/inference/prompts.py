"""The one chat-prompt renderer: a conversation -> the text a model reads, beside
``checkpoints.tokenizers.encode_prompt`` (text -> token ids, BOS rule).

The tokenizer's chat template where it has one; without one (base models), one plain fallback:
``role: content`` lines, ending with ``assistant: `` where the model is to answer, the format
the trainer writes its examples in (``training.sft_data``), so a template-less expert is asked
the way it was taught. Chat (``chat.chat``), the demo's scoring (``demos.measure``),
lm-eval-style multi-turn few-shot prompts (``evaluation.runner.build_prompt``) and the trainer
all render through ``render_chat``.

A chat template is code from whoever published the model (a visitor's Hub pick, served), so it is
rendered here under bounds (``ChatTemplateError``, one line naming the bound), not by
``apply_chat_template``: in transformers' environment (the same sandbox, options, filters and
globals, so ordinary templates render to the same text), compiled with a count on every loop
step, call, filter and operator (``RENDER_STEPS``, ``RENDER_SECONDS``), and a size on every
string, list and dict a step makes and on the output (``RENDER_CHARS``, characters and items):
two nested ``range(100000)`` loops, ``'a' * 1000000000``, a ``join`` of huge ranges or a macro
that calls itself are refused within a second instead of holding a slot for hours or taking
gigabytes. A render inside a dispatcher job also stops when the job is cancelled (Cancel, the
visitor leaving: ``progress.cancel_check``), so a prompt rendered many times (a long chat's
turns fitted to the context, an evaluation's items) never outlasts a Cancel by more than one step. The sizes are checked before the operations that multiply them (``*``, ``**``,
``%``, ``format``, ``replace``, ``join``, ``indent``, ``wordwrap``, ``expandtabs``,
``translate``) and after every other. ``lipsum`` (never in a chat template) is left out.
"""
from __future__ import annotations

import re
import time
from contextvars import ContextVar
from functools import lru_cache, wraps

from ..progress import Cancelled, cancel_check

__all__ = ["PLAIN_STOP", "RENDER_CHARS", "RENDER_SECONDS", "RENDER_STEPS", "ChatTemplateError",
           "chat_stop", "has_chat_template", "render_chat", "render_template"]

# Where a reply of a template-less model ends: the next plain user line.
PLAIN_STOP = ("\nuser:",)


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_chat(tokenizer, messages: list[dict] | str, *, generation_prompt: bool = True,
                system: str | None = None) -> str:
    """The text of a conversation (a list of {"role", "content"}, or one user message) as
    ``tokenizer``'s chat template renders it (``generation_prompt``: ending where the assistant
    speaks next), else as plain ``role: content`` lines (``assistant: `` last with
    ``generation_prompt``). ``system``: a system message put first."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if system:
        messages = [{"role": "system", "content": system}, *messages]
    if has_chat_template(tokenizer):
        template = (tokenizer.get_chat_template() if hasattr(tokenizer, "get_chat_template")
                    else tokenizer.chat_template)
        # as apply_chat_template: keys whose value is None dropped; the special tokens by name
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        return render_template(template, messages=messages, tools=None, documents=None,
                               add_generation_prompt=generation_prompt,
                               **dict(getattr(tokenizer, "special_tokens_map", None) or {}))
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return text + ("assistant: " if generation_prompt else "")


def chat_stop(tokenizer) -> tuple[str, ...]:
    """Stop strings of a chat reply: none with a template (its end-of-turn token ends it), the
    next plain user line without one."""
    return () if has_chat_template(tokenizer) else PLAIN_STOP


# --------------------------------------------------------------------------- bounded templates
RENDER_STEPS = 1_000_000    # loop steps, calls, filters and operators of one render
RENDER_SECONDS = 2.0        # one render (an ordinary template takes well under a millisecond)
RENDER_CHARS = 1_000_000    # characters and items of any one value made, and of the output
TEMPLATE_CHARS = 1_000_000  # the template's own text (real ones: a few kB to ~30 kB)
CANCEL_EVERY = 256          # steps between two looks at the job's Cancel (microseconds apart)
_WIDTH = re.compile(r"%[-+ #0]*\d*\.?\d{7}|\{[^{}]*:[^{}]*\d{7}")   # a field width of a million+

_BUDGET: ContextVar[_Budget | None] = ContextVar("layerswap_render_budget", default=None)


class ChatTemplateError(ValueError):
    """A chat template refused (one line: the bound it ran into)."""


class _Refused(Exception):
    """Raised inside a render; ``render_template`` turns it into ChatTemplateError."""


class _Budget:
    """One render's steps, output and deadline, and whether its job was cancelled meanwhile
    (``progress.cancel_check``: a Cancel or a visitor leaving stops a running render, checked
    every ``CANCEL_EVERY`` steps)."""

    def __init__(self):
        self.steps = self.output = 0
        self.deadline = time.monotonic() + RENDER_SECONDS
        self.cancelled = cancel_check()

    def step(self) -> None:
        self.steps += 1
        if self.steps > RENDER_STEPS:
            raise _Refused(f"runs past {RENDER_STEPS:,} loop steps, calls and operators")
        if time.monotonic() > self.deadline:
            raise _Refused(f"runs past {RENDER_SECONDS:g} s")
        if self.cancelled is not None and not self.steps % CANCEL_EVERY and self.cancelled():
            raise Cancelled()

    def counted(self, iterable):
        for item in iterable:
            self.step()
            yield item


def _step() -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.step()


def _size(value, seen: dict | None = None) -> int:
    """Characters and items of ``value`` with every shared part counted where it appears (what
    printing it would write), stopped past RENDER_CHARS. Each part is sized once per call
    (``seen``); nothing is kept after it (a render's values may be freed as it goes)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        seen = {} if seen is None else seen
        hit = seen.get(id(value))
        if hit is not None:
            return hit
        n = len(value)
        for item in (value.values() if isinstance(value, dict) else value):
            n += _size(item, seen)
            if n > RENDER_CHARS:
                break
        if isinstance(value, dict) and n <= RENDER_CHARS:
            n += sum(_size(k, seen) for k in value)
        seen[id(value)] = n
        return n
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() // 3
    if isinstance(value, range):
        return len(value)
    return 1


def _refuse_over(n: int, what: str) -> None:
    if n > RENDER_CHARS:
        raise _Refused(f"would make {what} of over {RENDER_CHARS:,} characters or items")


def _checked(value):
    _refuse_over(_size(value), "a value")
    return value


def _check_ints(args, kwargs) -> None:
    """No call or filter of a chat template takes a number this large (a width, a count)."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > RENDER_CHARS:
            raise _Refused(f"passes the number {v} (over {RENDER_CHARS:,})")


def _formatted(fmt: str, marker: str, values) -> int:
    """An upper bound of what ``fmt`` formats to (each field the largest value), refused for a
    field width of a million or more."""
    if _WIDTH.search(fmt):
        raise _Refused("asks for a field width of a million characters or more")
    return len(fmt) + fmt.count(marker) * max((_size(v) for v in values), default=0)


def _before(name: str, s, args: tuple, kwargs: dict, filter_: bool) -> tuple:
    """What the string method (``filter_``: the filter) ``name`` of ``s`` would make, estimated
    before it runs (the operations whose output can be many times their inputs); returns
    ``(s, args)``, an iterable to join read into a list."""
    if name == "join":
        if filter_:
            items, sep = list(s), args[0] if args else kwargs.get("d", "")
            s = items
        else:
            items, sep = list(args[0]) if args else [], s
            args = (items, *args[1:])
        _refuse_over(_size(items) + len(str(sep)) * len(items), "a joined string")
        return s, args
    text = s if isinstance(s, str) else str(s) if filter_ and _size(s) <= RENDER_CHARS else None
    if text is None:
        return s, args
    if name == "replace" and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        _refuse_over(len(text) + (text.count(old) if old else len(text) + 1)
                     * max(len(new) - len(old), 0), "a replaced string")
    elif name in ("format", "format_map"):
        values = (*args, *kwargs.values(), *(args[0].values() if name == "format_map" and args
                                             and isinstance(args[0], dict) else ()))
        _refuse_over(_formatted(text, "%" if filter_ else "{", values), "a formatted string")
    elif name == "indent":
        width = args[0] if args else kwargs.get("width", 4)
        _refuse_over(len(text) + (text.count("\n") + 1)
                     * (width if isinstance(width, int) else len(str(width))),
                     "an indented string")
    elif name == "wordwrap":
        width = args[0] if args else kwargs.get("width", 79)
        wrap = kwargs.get("wrapstring") or (args[2] if len(args) > 2 else None) or "\n"
        _refuse_over(len(text) + (len(text) // max(int(width), 1) + 1) * len(str(wrap)),
                     "a wrapped string")
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        _refuse_over(len(text) + text.count("\t") * int(tab), "an expanded string")
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((_size(v) for v in args[0].values()), default=0)
        _refuse_over(len(text) * max(longest, 1), "a translated string")
    return s, args


def _binop(operator: str, left, right) -> None:
    """Refuses a ``*``, ``**``, ``%`` or ``+`` whose result would be too large, before it runs."""
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "*":
        if ints:
            n = (left.bit_length() + right.bit_length()) // 3
        elif isinstance(right, int):
            n = _size(left) * right
        elif isinstance(left, int):
            n = _size(right) * left
        else:
            return
        _refuse_over(n, "a product")
    elif operator == "**" and ints and right > 0 and abs(left) > 1:
        _refuse_over(right * left.bit_length() // 3, "a power")
    elif operator == "%" and isinstance(left, str):
        values = right.values() if isinstance(right, dict) else (
            right if isinstance(right, tuple) else (right,))
        if "*" in left:                  # a width taken from the values
            _check_ints(tuple(values), {})
        _refuse_over(_formatted(left, "%", values), "a formatted string")
    elif operator == "+":
        _refuse_over(_size(left) + _size(right), "a sum")


@lru_cache(maxsize=1)
def _environment():
    """transformers' chat-template environment (``_compile_jinja_template``: the immutable
    sandbox, trim_blocks/lstrip_blocks, loopcontrols and the ``generation`` tag, its tojson,
    raise_exception, strftime_now, dict and namespace), bounded: every loop's iterable, every
    output and every literal list, tuple, dict or ``~`` concatenation goes through a counting
    filter, compiled in; calls, filters and the ``*``, ``**``, ``%``, ``+`` operators through
    checks."""
    import json
    from datetime import datetime

    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace
    from jinja2.visitor import NodeTransformer

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` (assistant masks): its body as it is."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def wrap(node, name: str):
        return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

    class Counted(NodeTransformer):
        def visit_For(self, node):
            self.generic_visit(node)
            node.iter = wrap(node.iter, "_ls_loop")
            return node

        def visit_Output(self, node):
            self.generic_visit(node)
            node.nodes = [wrap(n, "_ls_out") for n in node.nodes]
            return node

        def visit_Concat(self, node):
            self.generic_visit(node)
            node.nodes = [wrap(n, "_ls_size") for n in node.nodes]
            return wrap(node, "_ls_size")

        def _literal(self, node):
            self.generic_visit(node)
            return wrap(node, "_ls_size") if getattr(node, "ctx", "load") == "load" else node
        visit_List = visit_Tuple = visit_Dict = _literal

    @jinja2.pass_context
    def loop_filter(context, iterable):
        budget = _BUDGET.get()
        return iterable if budget is None else budget.counted(iterable)

    @jinja2.pass_context
    def out_filter(context, value):
        budget = _BUDGET.get()
        if budget is not None:
            budget.output += _size(value)
            if budget.output > RENDER_CHARS:
                raise _Refused(f"writes over {RENDER_CHARS:,} characters")
        return value

    @jinja2.pass_context
    def size_filter(context, value):
        return _checked(value)

    def bounded(name: str, func):
        passes = getattr(func, "jinja_pass_arg", None) is not None

        @wraps(func)
        def run(*args, **kwargs):
            _step()
            _check_ints(args, kwargs)
            if name in _PRECHECKED and len(args) > passes:
                value, rest = _before(name, args[passes], args[passes + 1:], kwargs, True)
                args = (*args[:passes], value, *rest)
            return _checked(func(*args, **kwargs))
        return run

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%", "+"})

        def _parse(self, source, name, filename):
            return Counted().visit(super()._parse(source, name, filename))

        def call_binop(self, context, operator, left, right):
            _step()
            _binop(operator, left, right)
            return _checked(super().call_binop(context, operator, left, right))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's signature
            _step()
            _check_ints(args, kwargs)
            method = getattr(__obj, "__wrapped__", __obj)    # the sandbox's str.format wrapper
            owner = getattr(method, "__self__", None)
            if isinstance(owner, str):
                _, args = _before(getattr(method, "__name__", ""), owner, args, kwargs, False)
            return _checked(super().call(__context, __obj, *args, **kwargs))

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        if indent is not None:
            _refuse_over(_size(x) * (2 + (indent if isinstance(indent, int) else len(indent))),
                         "an indented JSON")
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(Namespace):
        def __init__(*args, **kwargs):   # Namespace's own signature trick (namespace(self=...))
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                    f"but got {name!r}. Please rename the attribute.")

    env = Bounded(trim_blocks=True, lstrip_blocks=True,
                  extensions=[Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.filters = {name: bounded(name, f) for name, f in env.filters.items()}
    env.filters.update(_ls_loop=loop_filter, _ls_out=out_filter, _ls_size=size_filter)
    env.globals.pop("lipsum", None)
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       dict=TemplateDict(), namespace=TemplateNamespace)
    return env


_PRECHECKED = {"join", "replace", "format", "indent", "wordwrap"}


@lru_cache(maxsize=16)
def _compiled(template: str):
    return _environment().from_string(template)


def render_template(template: str, **context) -> str:
    """``template`` rendered with ``context`` under the bounds (``ChatTemplateError``, one line,
    past any of them)."""
    if len(template) > TEMPLATE_CHARS:
        raise ChatTemplateError(f"the chat template is {len(template):,} characters long (at "
                                f"most {TEMPLATE_CHARS:,}): refused")
    compiled = _compiled(template)
    token = _BUDGET.set(_Budget())
    try:
        return compiled.render(**context)
    except _Refused as e:
        raise ChatTemplateError(f"the chat template {e}: refused") from None
    except RecursionError:
        raise ChatTemplateError("the chat template nests its macros or loops too deeply: "
                                "refused") from None
    finally:
        _BUDGET.reset(token)
