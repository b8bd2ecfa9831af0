"""The Models tab: the three references vetted, described from their headers and checked once
(``check_models``: the ``ModelsReport``), and the ``Session`` opened on them (``open_session``).
Nothing heavy runs here: no weights are loaded."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from ..checkpoints import hub as served_hub
from ..checkpoints.compatibility import ModelSet, open_models, problems as compatibility_problems
from ..checkpoints.embedded import EMBEDDED_PREFIX, embedded
from ..checkpoints.loading import dense_from_adapter, describe
from ..checkpoints.references import DEFAULT_BASE, is_adapter
from ..checkpoints.tokenizer_panel import TokenizerPanel, tokenizer_panel
from ..evaluation.languages import LANGUAGES, language_of
from ..progress import say as _say
from .served import (HUB_ID, LIMITS, LOCAL, Access, Progress, WorkbenchError, capped, hide_paths,
                     readable_error, recipe_name, vet_reference)
from .session import ROLE_LABELS, Session

# the bases that ship embedded (the Models tab offers them): the default first, then every other
# embedded model that is not an adapter over one
EMBEDDED_BASES = tuple(dict.fromkeys((DEFAULT_BASE, *(EMBEDDED_PREFIX + name for name, row
                                                      in embedded().items() if row.base is None))))


@dataclass
class ModelsReport:
    refs: dict[str, str]               # what the library resolves (vetted; adapters: dense folders)
    rows: list[list[str]]              # role, reference, architecture, layers, hidden, vocab, dtype, size
    problems: list[str]
    num_layers: int | None = None
    names: dict[str, str] | None = None   # the references as the visitor gave them
    access: Access = LOCAL
    models: ModelSet | None = None        # the opened models (headers), checked once
    notes: tuple[str, ...] = ()           # warnings that do not stop the merge
    tokenizers: TokenizerPanel | None = None   # what differs in tokenizers and chat templates
    recipe: dict[str, str] | None = None  # how recipes name the models (``served.recipe_name``)

    HEADERS = ("role", "model", "architecture", "layers", "hidden", "vocab", "dtype", "size")

    @property
    def ok(self) -> bool:
        return not self.problems

    def markdown(self) -> str:
        panel = ("" if self.tokenizers is None or self.tokenizers.identical
                 else "\n\n" + self.tokenizers.markdown())
        if self.ok:
            return (f"**Compatible**: same architecture, shapes and vocabulary "
                    f"({self.num_layers} layers). Ready to configure."
                    + "".join(f"\n\n⚠ {n}" for n in self.notes) + panel)
        return "**Not compatible**:\n" + "\n".join(f"- {p}" for p in self.problems) + panel


def check_models(base: str, task: str, lang: str, progress: Progress | None = None,
                 access: Access = LOCAL) -> ModelsReport:
    """Describe the three models from their headers and check they can be merged.

    Nothing heavy runs: no weights are loaded. ``base`` may be empty (then the methods and
    views that need it say so). Every reference is vetted (``vet_reference``) before it is read.
    Raises WorkbenchError when a reference cannot be used at all, naming each one that cannot;
    its ``rows`` attribute is the models table with the readable ones described.
    """
    names = {role: capped(f"{ROLE_LABELS[role]} reference", ref, LIMITS.ref_chars).strip()
             for role, ref in (("base", base), ("task", task), ("lang", lang))}
    for role in ("task", "lang"):
        if not names[role]:
            raise WorkbenchError(f"give a {ROLE_LABELS[role]} (an embedded: name, a folder or a Hub id)")
    names = {r: v for r, v in names.items() if v}
    refs, rows, infos, errors, recipe = {}, {}, {}, [], {}
    for i, (role, name) in enumerate(names.items()):   # base first: adapters need it
        label = ROLE_LABELS[role]
        try:
            try:
                ref = vet_reference(name, access, progress)
                # served: the visitor's name for it (an adapter's, not its merge's folder)
                recipe[role] = recipe_name(name, ref, access)
                if role in ("task", "lang") and is_adapter(ref):   # merged into the base once
                    ref = str(dense_from_adapter(ref, refs.get("base"), progress))
                if not access.served:
                    recipe[role] = ref
            except ValueError as e:
                raise WorkbenchError(f"{label}: {readable_error(e)}") from e
            _say(progress, i / (len(names) + 1), f"reading {label} {name}")
            try:
                # a first use builds the model (a conversion, an adapter applied): its own bar
                info = describe(ref, progress=lambda f, m: _say(
                    progress, f, f"{label} ({i + 1} of {len(names)}): {m}"))
            except Exception as e:  # noqa: BLE001 - any unreadable model becomes one message
                if access.served and HUB_ID.fullmatch(name):   # not kept in the served cache
                    served_hub.served_cache().discard(name, ref)
                raise WorkbenchError(f"{label} {name!r}: {readable_error(e)}") from e
        except WorkbenchError as e:   # the others are still read: their rows stay valid
            errors.append(str(e))
            rows[role] = [label, _cell(name), _cell(f"⚠ cannot be read: {readable_error(e)}"),
                          "", "", "", "", ""]   # the whole reason is on the status line
            continue
        refs[role], infos[role] = ref, info
        rows[role] = [label, name, info.architecture,
                      str(info.num_layers), str(info.hidden_size), str(info.vocab_size), info.dtype,
                      f"{info.num_params / 1e6:.1f} M params, {info.size_bytes / 2**20:.0f} MiB"]
    if errors:
        err = WorkbenchError("; ".join(errors))
        err.rows = list(rows.values())   # the table: every reference, read or not
        raise err
    rows = list(rows.values())
    _say(progress, len(refs) / (len(refs) + 1), "checking compatibility")
    # the one check (checkpoints.compatibility), against the task expert; the Session reuses it
    models = open_models({role: refs[role] for role in sorted(refs, key=lambda r: r != "task")})
    found = compatibility_problems(models)
    if access.served:   # each model by its name, never its folder on the server
        folders = {path: recipe[role] for role, path in models.paths.items()}
        found = [hide_paths(p, folders) for p in found]
    note = reading_note(refs.get("base") or refs["task"], names["lang"])
    # tensors no kind rule can address, said before anything is built (issue #65)
    notes = [note] + [f"{role}: {infos[role].warning()}" for role in ("task", "lang", "base")
                      if role in infos and infos[role].warning()]
    notes.append(infos["task"].vision_note())   # a multimodal wrapper's kept vision tower
    return ModelsReport(refs, rows, found, infos["task"].num_layers, names, access, models,
                        tuple(n for n in notes if n), tokenizer_panel(models.paths), recipe)


READING_RATIO = 3.0   # tokens per word in the expert's language over English: a warning above


@functools.lru_cache(maxsize=16)
def _tokens_per_word(tokenizer_json: str, mtime: float, code: str) -> tuple[float, float]:
    """(language, English) tokens per word of a language's chat examples and their English
    twins under one tokenizer file; one load per file and language (a 262k-token
    tokenizer.json takes 1-4 s to load on this CPU)."""
    from tokenizers import Tokenizer   # lazy: only a language with examples needs it

    tok = Tokenizer.from_file(tokenizer_json)
    row = LANGUAGES[code]
    return tuple(sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)
                 / sum(len(t.split()) for t in texts)
                 for texts in (row.chat_examples, row.english_twins))


def reading_note(base_folder, lang_ref: str) -> str | None:
    """A warning where the base's tokenizer reads the language expert's language badly: its
    chat examples take READING_RATIO times the tokens per word of their English twins or more
    (SmolLM2-135M spends 6.4 per Bengali word, 1.3 per English one); None otherwise or where
    the language or the tokenizer file is unknown."""
    code = language_of(lang_ref)
    row = LANGUAGES.get(code) if code else None
    path = Path(base_folder) / "tokenizer.json"
    if row is None or not row.english_twins or not path.is_file():
        return None
    lang, en = _tokens_per_word(str(path), path.stat().st_mtime, code)
    if lang < READING_RATIO * en:
        return None
    return (f"this base reads {row.name} at {lang:.1f} tokens per word ({en:.1f} for the same "
            f"problems in English): its models see {row.name} text in small pieces and often "
            f"answer it badly; a base whose tokenizer covers {row.name} reads it better")


TABLE_CELL_CHARS = 80   # a table cell's text: a long reference or reason keeps the columns on screen


def _cell(text: str) -> str:
    text = str(text)
    return text if len(text) <= TABLE_CELL_CHARS else text[:TABLE_CELL_CHARS - 1] + "…"


def unchecked_rows(base, task, lang) -> list[list[str]]:
    """Rows of the models table for references that could not be read (a failed check)."""
    given = {"base": base, "task": task, "lang": lang}
    return [[ROLE_LABELS[role], _cell(str(ref or "")), "(not read)", "", "", "", "", ""]
            for role, ref in given.items() if str(ref or "").strip()]


def open_session(base: str, task: str, lang: str, progress: Progress | None = None,
                 access: Access = LOCAL, visitor: str | None = None
                 ) -> tuple[Session | None, ModelsReport]:
    """The report, and a new Session when the models are compatible (else None); ``visitor``:
    the page it is for (``Session``)."""
    report = check_models(base, task, lang, progress, access)
    return (Session(report, visitor) if report.ok else None), report
