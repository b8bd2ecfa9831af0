"""The tokenizer and chat-template panel (``checkpoints.tokenizer_panel``) on copies of the
embedded SmolLM2 tokenizer, each changed in one place: it names exactly that place."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from layerswap_core.checkpoints.references import resolve
from layerswap_core.checkpoints.tokenizer_panel import MAX_DIFF_LINES, tokenizer_panel
from layerswap_core.checkpoints.tokenizers import TOKENIZER_FILES


@pytest.fixture(scope="module")
def source() -> Path:
    return resolve("embedded:smollm2-135m-instruct")


def tokenizer_copy(source: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, dst / name)
    return dst


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")


def test_identical_files_say_so_and_name_the_tokenizer_kept(source, tmp_path):
    task, lang = tokenizer_copy(source, tmp_path / "task"), tokenizer_copy(source, tmp_path / "lang")
    panel = tokenizer_panel({"task": task, "lang": lang})
    assert panel.identical and not panel.details
    assert panel.lines() == ["tokenizers and chat templates: the same in every model; the merge "
                             "writes the task expert's tokenizer files and chat template "
                             "(tokenizer_source)"]
    assert tokenizer_panel({"task": task, "lang": lang}, kept="lang").lines()[0].endswith(
        "the language expert's tokenizer files and chat template (tokenizer_source)")


def test_a_changed_eos_token_is_a_warning_naming_both(source, tmp_path):
    task, lang = tokenizer_copy(source, tmp_path / "task"), tokenizer_copy(source, tmp_path / "lang")
    before = json.loads((task / "tokenizer_config.json").read_text())["eos_token"]
    edit_json(lang / "tokenizer_config.json", lambda d: d.update(eos_token="<|endoftext|>"))
    panel = tokenizer_panel({"task": task, "lang": lang})
    assert not panel.refusals
    assert panel.warnings == [f"language expert vs task expert: eos token '<|endoftext|>' vs "
                              f"{before!r}"]
    assert "⚠ language expert vs task expert: eos token" in panel.markdown()


def test_a_changed_chat_template_shows_its_diff(source, tmp_path):
    task, lang = tokenizer_copy(source, tmp_path / "task"), tokenizer_copy(source, tmp_path / "lang")
    tpl = lang / "chat_template.jinja"
    text = tpl.read_text(encoding="utf-8")
    assert "<|im_start|>" in text
    tpl.write_text(text.replace("<|im_start|>", "<|start|>", 1), encoding="utf-8")
    panel = tokenizer_panel({"task": task, "lang": lang, "base": task})
    assert panel.warnings == ["language expert vs task expert: chat templates differ (diff below)"]
    assert any(d.startswith("-") and "<|im_start|>" in d for d in panel.details)
    assert any(d.startswith("+") and "<|start|>" in d for d in panel.details)
    (lang / "chat_template.jinja").unlink()
    panel = tokenizer_panel({"task": task, "lang": lang})
    assert panel.warnings == ["language expert vs task expert: only the task expert has a chat "
                              "template"]


def test_an_added_token_changes_ids_and_is_refused_with_its_id(source, tmp_path):
    task, lang = tokenizer_copy(source, tmp_path / "task"), tokenizer_copy(source, tmp_path / "lang")

    def add(d):
        new_id = max(max(d["model"]["vocab"].values()), *(t["id"] for t in d["added_tokens"])) + 1
        d["added_tokens"].append({"id": new_id, "content": "<tool>", "single_word": False,
                                  "lstrip": False, "rstrip": False, "normalized": False,
                                  "special": True})
    edit_json(lang / "tokenizer.json", add)
    panel = tokenizer_panel({"task": task, "lang": lang})
    assert len(panel.refusals) == 1 and "'<tool>'" in panel.refusals[0]
    assert panel.details == ["added token '<tool>': language expert id 49152, task expert absent"]


def test_an_added_tokens_specialness_is_a_warning(source, tmp_path):
    task, lang = tokenizer_copy(source, tmp_path / "task"), tokenizer_copy(source, tmp_path / "lang")
    tok = json.loads((task / "tokenizer.json").read_text())
    first = tok["added_tokens"][0]

    def flip(d):
        d["added_tokens"][0]["special"] = not first["special"]
    edit_json(lang / "tokenizer.json", flip)
    panel = tokenizer_panel({"task": task, "lang": lang})
    flag = "special" if not first["special"] else "not special"
    assert (f"language expert vs task expert: added token {first['content']!r} (id "
            f"{first['id']}) is {flag} in the language expert") in panel.warnings[0]


def test_the_models_check_shows_the_panel_where_something_differs(tiny, tmp_path):
    """The Models tab's check (``check_models``) carries the panel: nothing where the three
    tokenizers are the same, the difference where the language expert's EOS token differs."""
    from layerswap_core.workbench.models import check_models

    report = check_models(str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    assert report.ok and report.tokenizers.identical
    assert "Tokenizers and chat templates" not in report.markdown()
    lang = tmp_path / "lang"
    shutil.copytree(tiny["lang"], lang)
    edit_json(lang / "tokenizer_config.json", lambda d: d.update(eos_token="<|endoftext|>"))
    report = check_models(str(tiny["base"]), str(tiny["task"]), str(lang))
    assert report.ok
    assert "**Tokenizers and chat templates**\n- ⚠ language expert vs task expert: eos token " \
           "'<|endoftext|>'" in report.markdown()


def _cycled_template(n: int, step: int) -> str:
    """``n`` lines, each one of 100 comment lines (every one repeated, below difflib's "popular"
    cut), in an order set by ``step``: two such templates are difflib's slow case."""
    return "\n".join(f"{{# line {(i * step) % 100} #}}" for i in range(n)) + "\n"


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_two_30000_line_templates_are_compared_within_seconds(source, tmp_path):
    from bounded import assert_bounded, run_attack

    task, lang = tokenizer_copy(source, tmp_path / "task"), tokenizer_copy(source, tmp_path / "lang")
    (task / "chat_template.jinja").write_text(_cycled_template(30_000, 1), encoding="utf-8")
    (lang / "chat_template.jinja").write_text(_cycled_template(30_000, 7), encoding="utf-8")
    setup = f"""
        from layerswap_core.checkpoints.tokenizer_panel import MAX_DIFF_LINES, tokenizer_panel
        paths = {{"task": {str(task)!r}, "lang": {str(lang)!r}}}
    """
    r = run_attack(setup, "(lambda p: p.warnings + p.details)(tokenizer_panel(paths))")
    assert_bounded(r)
    assert "chat templates differ" in r.message and "30,000 lines, sha256" in r.message
    assert "not diffed here" in r.message
    # at the bound, the slow case is still diffed, in well under a second
    (task / "chat_template.jinja").write_text(_cycled_template(MAX_DIFF_LINES, 1), "utf-8")
    (lang / "chat_template.jinja").write_text(_cycled_template(MAX_DIFF_LINES, 7), "utf-8")
    started = time.monotonic()
    panel = tokenizer_panel({"task": task, "lang": lang})
    assert time.monotonic() - started < 5
    assert panel.warnings == ["language expert vs task expert: chat templates differ (diff below)"]
    assert panel.details[0] == "--- task expert" and panel.details[-1].endswith("more lines)")
