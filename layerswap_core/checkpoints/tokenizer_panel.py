"""What differs between the tokenizers and chat templates of the models to merge, and what the
merged model keeps: the Models tab's panel and `layerswap check`'s lines.

A merge writes one tokenizer: the tokenizer files of one model (``tokenizer_source``, by default
the task expert). What turns text into ids must be the same in all three
(``tokenizers.tokenizer_difference``: refused otherwise); what does not change an id may still
differ and garble the merged model's output: the special tokens named as BOS, EOS, padding and
unknown (where generation stops), the added tokens' specialness, and the chat template (how a
conversation is written). Files with the same bytes are not read (``file_digest``, cached by the
file's stamp), so the usual trio of experts fine-tuned from one base costs a few hashes.
"""
from __future__ import annotations

import difflib
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from .reading import read_json_object
from .tokenizers import file_digest, tokenizer_difference

SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                "chat_template.json")
DIFF_LINES = 24          # a chat template's diff is cut after this many lines
# difflib's time grows with the product of the two templates' lengths (and worse for lines that
# repeat): two 30,000-line templates of 100 repeated lines would take hours. Real templates have
# tens to a few hundred lines; longer ones are compared by their digests only (equal text is
# found without difflib: the files' hashes, then the strings). Two hostile 2,000-line templates
# diff in about 0.4 s.
MAX_DIFF_LINES = 2_000
LABELS = {"task": "task expert", "lang": "language expert", "base": "base"}


@dataclass
class TokenizerPanel:
    """``refusals``: differences a merge cannot take (ids); ``warnings``: differences that may
    garble the output (special tokens, specialness, chat template); ``details``: the evidence
    (tokens, ids, a template diff); ``kept``: the role whose tokenizer files the merge writes."""
    kept: str = "task"
    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not (self.refusals or self.warnings)

    def lines(self) -> list[str]:
        """Plain lines (the CLI's)."""
        keep = (f"the merge writes the {LABELS.get(self.kept, self.kept)}'s tokenizer files "
                "and chat template (tokenizer_source)")
        if self.identical:
            return [f"tokenizers and chat templates: the same in every model; {keep}"]
        return ([f"refused: tokenizer {r}" for r in self.refusals]
                + [f"warning: {w}" for w in self.warnings] + [keep])

    def markdown(self) -> str:
        """The Models tab's panel."""
        if self.identical:
            return "**Tokenizers and chat templates**: " + self.lines()[0] + "."
        out = ["**Tokenizers and chat templates**"]
        out += [f"- ⛔ {r}" for r in self.refusals] + [f"- ⚠ {w}" for w in self.warnings]
        out.append(f"- {self.lines()[-1]}.")
        if self.details:
            out.append("\n```\n" + "\n".join(self.details) + "\n```")
        return "\n".join(out)


def _json(path: Path) -> dict:
    """The file's JSON object (``reading.read_json_object``); {} where the model has no such
    file."""
    return read_json_object(path, kind="a tokenizer file") if path.is_file() else {}


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens(folder: Path) -> dict[str, str | None]:
    """BOS/EOS/padding/unknown as the tokenizer config names them (special_tokens_map.json
    where the config does not)."""
    config, mapping = _json(folder / "tokenizer_config.json"), _json(folder / "special_tokens_map.json")
    return {k: _token_text(config.get(k)) or _token_text(mapping.get(k)) for k in SPECIAL}


def chat_template(folder: Path) -> str | None:
    """The chat template a tokenizer would use: chat_template.jinja, chat_template.json, or
    tokenizer_config.json's (a named list: its "default")."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    value = _json(folder / "chat_template.json").get("chat_template")
    if value is None:
        value = _json(folder / "tokenizer_config.json").get("chat_template")
    if isinstance(value, list):
        value = next((t.get("template") for t in value
                      if isinstance(t, dict) and t.get("name") == "default"), None)
    return value if isinstance(value, str) else None


def added_tokens(folder: Path) -> dict[str, tuple[int, bool]]:
    """{content: (id, special)} of tokenizer.json's added tokens."""
    data = _json(folder / "tokenizer.json")
    return {t["content"]: (int(t["id"]), bool(t.get("special")))
            for t in data.get("added_tokens") or () if isinstance(t, dict) and "content" in t}


def _lines_digest(text: str) -> str:
    """A template named by its length and the start of its sha256."""
    return (f"{len(text.splitlines()):,} lines, sha256 "
            f"{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}")


def _digests(folder: Path, names) -> tuple:
    return tuple(file_digest(folder / n) if (folder / n).is_file() else None for n in names)


def tokenizer_panel(paths: dict[str, str | os.PathLike], kept: str | None = None
                    ) -> TokenizerPanel:
    """The panel for the models ``{role: folder}`` against the role whose tokenizer the merge
    keeps (``kept``: default the task expert)."""
    kept = kept or ("task" if "task" in paths else next(iter(paths)))
    folders = {r: Path(p) for r, p in paths.items()}
    panel = TokenizerPanel(kept)
    ref = folders[kept]
    for role, folder in folders.items():
        if role == kept:
            continue
        who = f"{LABELS.get(role, role)} vs {LABELS.get(kept, kept)}"
        why = tokenizer_difference(folder, ref, (LABELS.get(role, role), LABELS.get(kept, kept)))
        if why:
            panel.refusals.append(f"{who}: {why}")
        if _digests(folder, ("tokenizer.json",)) != _digests(ref, ("tokenizer.json",)):
            mine, theirs = added_tokens(folder), added_tokens(ref)
            for content in sorted(set(mine) | set(theirs), key=lambda c: (mine.get(c) or
                                                                          theirs.get(c))[0]):
                a, b = mine.get(content), theirs.get(content)
                if a == b:
                    continue
                if a is not None and b is not None and a[0] == b[0]:
                    panel.warnings.append(f"{who}: added token {content!r} (id {a[0]}) is "
                                          f"{'special' if a[1] else 'not special'} in the "
                                          f"{LABELS.get(role, role)}, "
                                          f"{'special' if b[1] else 'not special'} in the "
                                          f"{LABELS.get(kept, kept)}")
                else:
                    panel.details.append(
                        f"added token {content!r}: {LABELS.get(role, role)} "
                        f"{f'id {a[0]}' if a else 'absent'}, {LABELS.get(kept, kept)} "
                        f"{f'id {b[0]}' if b else 'absent'}")
        if _digests(folder, CONFIG_FILES) == _digests(ref, CONFIG_FILES):
            continue                       # the same bytes: the same specials and template
        mine, theirs = special_tokens(folder), special_tokens(ref)
        for key in SPECIAL:
            if mine[key] != theirs[key]:
                panel.warnings.append(f"{who}: {key.replace('_', ' ')} {mine[key]!r} vs "
                                      f"{theirs[key]!r}")
        a, b = chat_template(folder), chat_template(ref)
        if a != b:
            if a is None or b is None:
                panel.warnings.append(f"{who}: only the "
                                      f"{LABELS.get(kept if a is None else role)} has a chat "
                                      "template")
            elif max(len(a.splitlines()), len(b.splitlines())) > MAX_DIFF_LINES:
                panel.warnings.append(f"{who}: chat templates differ")
                panel.details.append(
                    f"chat template: {LABELS.get(kept, kept)} {_lines_digest(b)}, "
                    f"{LABELS.get(role, role)} {_lines_digest(a)} (longer than "
                    f"{MAX_DIFF_LINES:,} lines: not diffed here)")
            else:
                panel.warnings.append(f"{who}: chat templates differ (diff below)")
                diff = list(difflib.unified_diff(b.splitlines(), a.splitlines(),
                                                 LABELS.get(kept, kept), LABELS.get(role, role),
                                                 lineterm="", n=1))
                panel.details += diff[:DIFF_LINES] + (
                    [f"... ({len(diff) - DIFF_LINES} more lines)"] if len(diff) > DIFF_LINES
                    else [])
    return panel
