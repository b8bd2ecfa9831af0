"""The conformance table (issue #65): tiny random trios of decoder-only causal-LM types, each
through `layerswap check`, the deltas, every merge method, the `{layers: '0-1', kinds: mlp}`
partition, the disk merge against the test's own plain-torch merge, the live engine and a save
(``conformance.run``). ``make test`` runs the issue's named types, each of which must pass every
step; ``make conformance`` (``LAYERSWAP_CONFORMANCE=all``) runs every decoder-only causal-LM type
of the pinned transformers within a time budget and writes the table into docs/models.md and
the count into the README (``LAYERSWAP_CONFORMANCE_WRITE=1``)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow   # the trios carry the embedded SmolLM2's tokenizer

def test_gemma3_wrapper_merges_its_decoder_and_keeps_its_vision_tower(tmp_path):
    """Gemma3ForConditionalGeneration as its checkpoints store it (``language_model.model.*``,
    ``vision_tower.*``, ``multi_modal_projector.*``): the decoder's layers are layers, the vision
    tower and projector are kept from the task expert by every method, and check, the Models
    tab and the plan say so."""
    from conformance import VISION_PART, make_trio, tensors

    from layerswap_core.checkpoints.architectures import get_architecture
    from layerswap_core.checkpoints.preflight import check
    from layerswap_core.checkpoints.reading import CheckpointReader
    from layerswap_core.merge.config import MergeConfig
    from layerswap_core.merge.executor import merge_to_folder, plan_for
    from layerswap_core.merge.plan import VISION_TEXT
    from layerswap_core.workbench.session import check_models

    paths = make_trio(tmp_path, "gemma3")
    reader = CheckpointReader(paths["task"])
    arch = get_architecture(reader.config())
    vision = [n for n in reader.names() if VISION_PART.search(n)]
    assert vision and set(arch.vision(reader.names())) == set(vision)
    assert arch.classify("language_model.model.layers.1.mlp.up_proj.weight") == (1, "mlp_up")
    assert arch.classify("vision_tower.encoder.layers.0.mlp.fc1.weight") == (None, "vision")
    said = (f"gemma3 is a multimodal wrapper: its decoder layers are merged; its vision tower "
            f"and projector ({len(vision)} tensors) are kept from the task expert")
    lines = check(str(paths["base"]), str(paths["task"]), str(paths["lang"])).lines()
    assert any(said in line for line in lines) and lines[-1].startswith("compatible")
    report = check_models(str(paths["base"]), str(paths["task"]), str(paths["lang"]))
    assert report.ok and any(said in n for n in report.notes)

    soup = MergeConfig(method="soup")
    assert f"{VISION_TEXT} ({len(vision)} tensors)" in plan_for(soup, paths["task"]).summary_text()
    merged = tensors(merge_to_folder(soup, task=paths["task"], lang=paths["lang"],
                                     out=tmp_path / "soup"))
    t, g = tensors(paths["task"]), tensors(paths["lang"])
    for n in merged:
        if n in vision:
            assert torch.equal(merged[n], t[n]) and not torch.equal(t[n], g[n]), n
        else:
            assert torch.allclose(merged[n], (t[n] + g[n]) / 2, atol=1e-6), n
