"""The Bengali demo trio over the embedded Gemma-3-270M (issue #52): the shipped adapters change
only their side's layers, the trio resolves offline, passes the Models check, builds a layer
swap and answers a Bengali question through the chat job; the recipe reproduces its first
training step on the CPU."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from layerswap_core.checkpoints import embedded as experts
from layerswap_core.demos import trios
from layerswap_core.checkpoints.adapters import load_adapter
from layerswap_core.checkpoints.architectures import get_architecture
from layerswap_core.merge.partition import Partition
from test_gemma import needs_gemma

LAYERS = 18   # Gemma-3-270M
ARCH = get_architecture({"model_type": "gemma3_text", "num_hidden_layers": LAYERS})
TRIO = trios.demo("bn").refs
SIDES = {TRIO["task"]: "task", TRIO["lang"]: "lang"}


def _log(ref: str) -> dict:
    return json.loads((experts.demo_adapter_dir(ref) / "training_log.json").read_text())


def _layer(module: str) -> int:
    return int(module.split("model.layers.", 1)[1].split(".", 1)[0])


@pytest.mark.parametrize("ref", list(SIDES))
def test_gemma_adapters_sit_in_the_layers_of_their_side(ref):
    cfg = _log(ref)["config"]
    assert cfg["mode"] == "partial_lora" and cfg["model"] == TRIO["base"]
    assert cfg["train_part"] == SIDES[ref]
    part = Partition.from_spec(cfg["partition"], LAYERS, cfg["scale_partition"])
    expected = {n for n in range(LAYERS)
                if part.model_for(f"model.layers.{n}.self_attn.q_proj.weight", ARCH) == SIDES[ref]}
    adapter = load_adapter(experts.demo_adapter_dir(ref))
    assert {_layer(m) for m in adapter.modules} == expected
    assert all(mod.delta().abs().max() > 0 for mod in adapter.modules.values())


def test_the_gemma_experts_share_no_layer_and_cover_the_model():
    task = {_layer(m) for m in load_adapter(experts.demo_adapter_dir(TRIO["task"])).modules}
    lang = {_layer(m) for m in load_adapter(experts.demo_adapter_dir(TRIO["lang"])).modules}
    assert not task & lang and task | lang == set(range(LAYERS))
    assert lang == {0, 1, 2, LAYERS - 1}


@pytest.mark.parametrize("ref", list(SIDES))
def test_the_cards_say_what_the_data_is(ref):
    card = (experts.demo_adapter_dir(ref) / "README.md").read_text()
    assert experts.GEMMA_NOTICE in card.replace("\n", " ")
    assert "layerswap train" in card and "machine-translated" in card
    assert all(arg in card for arg in _log(ref)["command"][2:])   # the exact command
    if ref == TRIO["lang"]:
        assert "shobdo" in card and "Apache-2.0" in card and "252 of 1,417" in card


@pytest.mark.slow
@needs_gemma
def test_the_bengali_trio_checks_builds_and_answers_in_bengali():
    from layerswap_core.merge.config import MergeConfig
    from layerswap_core.workbench import session as wb
    from layerswap_core.workbench import build as wb_build
    from layerswap_core.workbench import models as wb_models
    from layerswap_core.workbench.chat import chat_examples, chat_turn

    session, report = wb_models.open_session(TRIO["base"], TRIO["task"], TRIO["lang"])
    assert session is not None and not report.problems and report.num_layers == LAYERS
    try:
        name, examples = chat_examples(TRIO["lang"])
        assert name == "Bengali"
        assert all(any("\u0980" <= c <= "\u09ff" for c in q) for q in examples)
        cfg = MergeConfig.default_for(LAYERS, task=TRIO["task"], lang=TRIO["lang"],
                                      base=TRIO["base"])
        wb_build.build(session, cfg)
        assert session.built_config == cfg
        reply = list(chat_turn(session, examples[1], [], "merged", max_new_tokens=12))[-1]
        answer = reply.history[-1]["content"]
        assert reply.history[-2]["content"] == examples[1] and answer.strip()
    finally:
        wb.close_session(session)


RECIPES = {TRIO["task"]: "math-variants", TRIO["lang"]: "bengali-reading"}
# steps rerun: the math expert's 3 (two warmup steps, then the first update: ~12 s each here);
# the Bengali expert's 2 (35-70 s each here: its data, batches and loss, the trainer's update
# being the one the math expert's third step checks)
STEPS = {TRIO["task"]: 3, TRIO["lang"]: 2}


@pytest.mark.slow
@needs_gemma
@pytest.mark.parametrize("ref", list(RECIPES))
def test_the_recipe_reproduces_its_first_steps(ref, tmp_path):
    """The shipped expert's exact command (data regenerated from its recipe), its first steps
    on this CPU (``STEPS``): the losses of its training log. Without its held-out validation
    (before the first step and after the last): it changes no training loss, and on this CPU
    it was about half the test's time (two passes over 2 batches of 16 at 384 tokens)."""
    log = _log(ref)
    data = tmp_path / "train.jsonl"
    subprocess.run([sys.executable, "-m", "layerswap_core", "demo-data", RECIPES[ref],
                    "--split", "train", "--out", str(data)], check=True, capture_output=True)
    args = list(log["command"][2:])
    for flag in ("--eval-data", "--eval-batches", "--eval-every"):
        if flag in args:
            del args[args.index(flag):args.index(flag) + 2]
    sub = {"--data": str(data), "--out": str(tmp_path / "run"), "--steps": str(STEPS[ref]),
           "--save-every": "0"}
    for flag, value in sub.items():
        args[args.index(flag) + 1] = value
    r = subprocess.run([sys.executable, "-m", "layerswap_core", "train", *args],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:] + "\n" + shlex.join(args)
    got = json.loads((tmp_path / "run" / "training_log.json").read_text())["train_losses"]
    want = log["train_losses"][:STEPS[ref]]
    assert [g["step"] for g in got] == [w["step"] for w in want] == list(range(1, STEPS[ref] + 1))
    assert [g["loss"] for g in got] == pytest.approx([w["loss"] for w in want], abs=2e-3)


def test_a_base_that_reads_the_language_badly_gets_a_warning(embedded_base):
    """SmolLM2's tokenizer spends several times the tokens per Bengali word that it spends per
    English word: the Models check says so for a Bengali expert, not for the Swahili one."""
    from layerswap_core.workbench import models as wb_models

    note = wb_models.reading_note(embedded_base, TRIO["lang"])
    assert note and "Bengali" in note and "tokens per word" in note
    lang, en = (float(x) for x in re.findall(r"([\d.]+) ", note)[:2])
    assert lang >= wb_models.READING_RATIO * en
    assert wb_models.reading_note(embedded_base, "embedded:smollm2-swahili") is None
    assert wb_models.reading_note(embedded_base, "my-expert") is None      # no language named


@pytest.mark.slow
@needs_gemma
def test_gemma_reads_bengali_without_the_warning():
    from layerswap_core.checkpoints.references import resolve
    from layerswap_core.workbench import models as wb_models

    assert wb_models.reading_note(resolve(TRIO["base"]), TRIO["lang"]) is None
