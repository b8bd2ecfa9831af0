"""The embedded demo experts: data recipes (train/eval never mix), shipped adapters, held-out loss."""
from __future__ import annotations

import json
import time

import pytest

from layerswap_core.demos import recipes as D
from layerswap_core.checkpoints import embedded as experts
from layerswap_core.demos import trios
from layerswap_core.checkpoints import loading, references
from layerswap_core.evaluation.data import mgsm_overlap_templates

# Optional system data: Debian's FreeDict Swahili<->English dictionaries (the Swahili recipe).
NEEDS_FREEDICT = pytest.mark.skipif(
    not all((D.FREEDICT_DIR / f"{stem}{ext}").exists() for stem in D.FREEDICT_FILES.values()
            for ext in (".index", ".dict.dz")),
    reason="needs the Debian packages dict-freedict-swh-eng and dict-freedict-eng-swh "
           "(apt-get install dict-freedict-swh-eng dict-freedict-eng-swh)")


def _templates(rows) -> set[int]:
    return {int(r["source"].split()[-1]) for r in rows if r["source"].startswith("gsm-symbolic eng ")}


def test_demo_experts_are_registered():
    for ref in (trios.DEMO_TASK, trios.DEMO_LANG):
        assert ref.startswith(references.EMBEDDED_PREFIX)
        assert ref[len(references.EMBEDDED_PREFIX):] in experts.embedded()  # registered on first use
        assert experts.demo_adapter_dir(ref) == experts.demo_adapter_dir(ref.split(":", 1)[1])
    with pytest.raises(references.ModelLoadError, match="unknown demo expert"):
        experts.demo_adapter_dir("embedded:nope")


def test_math_recipe_uses_training_templates_only():
    train = D.math_examples("train", variants=0)
    held = D.math_examples("eval")
    assert _templates(train) == set(D.TRAIN_TEMPLATES) and _templates(held) == set(range(50, 100))
    # 0000-0049 minus the templates that are MGSM test items (0036 is MGSM row 11)
    assert set(D.TRAIN_TEMPLATES) == set(range(50)) - mgsm_overlap_templates()
    assert 36 not in D.TRAIN_TEMPLATES and len(D.TRAIN_TEMPLATES) == 39
    questions = {r["messages"][0]["content"] for r in held}
    assert not questions & {r["messages"][0]["content"] for r in train}
    for r in train:
        answer = r["messages"][-1]["content"]
        assert "####" in answer and "<<" not in answer  # worked solution, calculator marks removed


def test_math_variants_are_new_problems_of_the_same_template():
    rows = D.problems("eng", 0, variants=3)
    assert len(rows) == 4 and len({q for q, _ in rows}) == 4
    assert D.problems("eng", 0, variants=3) == rows  # seeded
    assert len(D.problems("eng", sorted(D.SLOW_TEMPLATES)[0], variants=3)) == 1


@NEEDS_FREEDICT
def test_swahili_recipe_has_no_worked_math_and_disjoint_splits():
    train = D.swahili_examples("train", variants=0)
    held = D.swahili_examples("eval")
    worked = {a for _, a in (D.problems("swh", i)[0] for i in range(100))}
    for r in train + held:
        response = r["messages"][-1]["content"]
        assert "####" not in response and response not in worked
    dict_words = lambda rows: {line.split(" — ")[0] for r in rows if r["source"].startswith("freedict")
                               for line in r["messages"][-1]["content"].splitlines()}
    assert dict_words(train) and dict_words(held) and not dict_words(train) & dict_words(held)
    gsm = lambda rows: {r["source"].split()[-2 if r["source"].endswith("question") else -1]
                        for r in rows if r["source"].startswith("gsm-symbolic")}
    assert max(int(i) for i in gsm(train)) < 50 <= min(int(i) for i in gsm(held))


def test_shipped_adapters_are_small_and_documented():
    total = 0
    for ref in (trios.DEMO_TASK, trios.DEMO_LANG):
        d = experts.demo_adapter_dir(ref)
        cfg = json.loads((d / "adapter_config.json").read_text())
        assert cfg["base_model_name_or_path"] == references.DEFAULT_BASE
        total += (d / "adapter_model.safetensors").stat().st_size
        card = (d / "README.md").read_text()
        assert "layerswap train" in card and "--mode partial_lora" in card
        assert "held-out" in card.lower() and "gsm_symbolic_templates" in card
    assert total <= 30 * 2**20
    # every shipped adapter (the demo trios', their seeds and the cross-fitting's fold 2) is
    # documented, and all of them together stay within the repository's budget for weights
    every = 0
    for d in experts.adapter_folders():
        card = (d / "README.md").read_text()
        assert "layerswap train" in card and "gsm_symbolic_templates" in card, d.name
        every += (d / "adapter_model.safetensors").stat().st_size
    assert every <= 90 * 2**20, f"{every / 2**20:.1f} MiB of adapters"   # 84.9 MiB in 7


@pytest.mark.slow
@pytest.mark.parametrize("ref", [trios.DEMO_TASK,
                                 pytest.param(trios.DEMO_LANG, marks=NEEDS_FREEDICT)])
def test_shipped_experts_load_fast_and_beat_the_base_on_their_domain(embedded_base, tmp_path, ref,
                                                                     all_threads):
    from layerswap_core.checkpoints.adapters import apply_adapter
    from layerswap_core.training.sft_data import heldout_nll

    rows = (D.math_variant_examples("eval")[:12] if ref == trios.DEMO_TASK
            else D.reading_examples("eval")[:24])  # the reading proxy (held-out templates)
    base, tok = loading.load_model(embedded_base)
    t0 = time.time()
    folder = apply_adapter(embedded_base, experts.demo_adapter_dir(ref), tmp_path / ref[9:])
    assert time.time() - t0 < 60  # seconds on an idle CPU; generous for a shared one
    expert, _ = loading.load_model(folder)
    assert heldout_nll(expert, rows, tokenizer=tok) < heldout_nll(base, rows, tokenizer=tok)


def test_wheel_ships_the_demo_adapters(tmp_path):
    """A wheel (not only a checkout) carries the adapters, under <prefix>/share/layerswap."""
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    root = Path(experts.__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(root), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(tmp_path)], check=True,
                   capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("layerswap-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for name in experts.SHIPPED_EXPERTS:
        for f in sorted((root / "assets" / "experts" / name).iterdir()):
            assert any(n.endswith(f"/data/share/layerswap/experts/{name}/{f.name}") for n in names)
    results = {t.result_file for t in trios.DEMOS.values()}
    results |= {f["result_file"] for t in trios.DEMOS.values() for f in t.folds.values()}
    results |= {t.crossfit_file for t in trios.DEMOS.values() if t.crossfit_file}
    assert {"demo_result.json", "demo_result_fold2.json", "demo_crossfit.json"} <= results
    for result in results:
        assert any(n.endswith(f"/data/share/layerswap/experts/{result}") for n in names)


@pytest.mark.slow
def test_shipped_experts_merge_offline_in_seconds(embedded_base, tmp_path):
    """The demo's default layer swap of the two shipped experts, written to disk from the cached
    builds: seconds, and each layer comes from the expert the plan names."""
    from safetensors import safe_open

    from layerswap_core.merge.config import MergeConfig
    from layerswap_core.merge.executor import merge_to_folder

    task = references.resolve(trios.DEMO_TASK)      # built once (cached) from the adapter
    lang = references.resolve(trios.DEMO_LANG)
    cfg = MergeConfig.default_for(30, task=trios.DEMO_TASK, lang=trios.DEMO_LANG,
                                  base=embedded_base)
    t0 = time.time()
    out = merge_to_folder(cfg, out=tmp_path / "swap")
    assert time.time() - t0 < 60   # a few seconds on an idle CPU; generous for a shared one

    def tensor(folder, name):
        with safe_open(str(next(folder.glob("*.safetensors"))), "pt") as f:
            return f.get_tensor(name)
    name = "model.layers.{}.self_attn.q_proj.weight"
    import torch
    assert torch.equal(tensor(out, name.format(0)), tensor(lang, name.format(0)))
    assert torch.equal(tensor(out, name.format(15)), tensor(task, name.format(15)))
    assert not torch.equal(tensor(task, name.format(0)), tensor(lang, name.format(0)))
