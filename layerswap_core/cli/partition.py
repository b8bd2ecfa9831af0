"""The one ``--partition`` argument of the commands (merge, plan, merge-lora, train)."""
from __future__ import annotations

from pathlib import Path

from ..merge.config import load_yaml
from ..merge.errors import ConfigError
from ..merge.partition import PRESET_LAYERS

MAX_RULES_FILE = 1 << 20  # bytes of a --partition rules file


def partition_arg(p: str):
    """--partition: a YAML file of rules (a list, or {partition: list}), else a preset name."""
    try:
        path = Path(p)
        is_file = len(p) < 4096 and path.is_file()
        text = path.read_text() if is_file and path.stat().st_size <= MAX_RULES_FILE else None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--partition {p[:80]!r}: cannot read the rules file ({e})") from None
    if not is_file:
        if p.upper() in PRESET_LAYERS:
            return p.upper()
        raise ConfigError(f"--partition {p[:80]!r}: give A, B, C or a YAML file of rules")
    if text is None:
        raise ConfigError(f"--partition {p}: the rules file is larger than {MAX_RULES_FILE} bytes")
    rules = load_yaml(text, f"--partition {p}")
    if isinstance(rules, dict) and "partition" in rules:
        rules = rules["partition"]
    return rules
