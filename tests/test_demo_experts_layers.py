"""The shipped demo experts change only the layers their recipes trained (partial training, the
follow-up's method): the math expert the middle layers, the language expert the outer ones, and
nothing anywhere else. Read from the adapters' own tensors and their training logs."""
from __future__ import annotations

import json

import pytest

from layerswap_core.checkpoints import embedded as experts
from layerswap_core.demos import trios
from layerswap_core.checkpoints.adapters import load_adapter
from layerswap_core.checkpoints.architectures import get_architecture
from layerswap_core.merge.partition import Partition

LAYERS = 30   # SmolLM2-135M-Instruct
ARCH = get_architecture({"model_type": "llama", "num_hidden_layers": LAYERS})
SIDES = {trios.DEMO_TASK: "task", trios.DEMO_LANG: "lang"}


def _layer(module: str) -> int:
    return int(module.split("model.layers.", 1)[1].split(".", 1)[0])


def _recipe(ref: str) -> tuple[Partition, str]:
    """(partition, trained side) as recorded in the expert's training log."""
    log = json.loads((experts.demo_adapter_dir(ref) / "training_log.json").read_text())
    cfg = log["config"]
    assert cfg["mode"] == "partial_lora", ref
    return Partition.from_spec(cfg["partition"], LAYERS, cfg["scale_partition"]), cfg["train_part"]


def _side_layers(part: Partition, side: str) -> set[int]:
    """Layers whose projections the partition gives to ``side``."""
    return {n for n in range(LAYERS)
            if part.model_for(f"model.layers.{n}.self_attn.q_proj.weight", ARCH) == side}


@pytest.mark.parametrize("ref", list(SIDES))
def test_adapter_tensors_sit_in_the_layers_of_their_side(ref):
    part, side = _recipe(ref)
    assert side == SIDES[ref]
    adapter = load_adapter(experts.demo_adapter_dir(ref))
    layers = {_layer(m) for m in adapter.modules}
    expected = _side_layers(part, side)
    assert layers == expected, (ref, sorted(layers ^ expected))
    # every shipped module really changes its weight (trained, not left at zero)
    for name, mod in adapter.modules.items():
        assert mod.delta().abs().max() > 0, name


def test_the_two_experts_share_no_layer_and_cover_the_model():
    task = {_layer(m) for m in load_adapter(experts.demo_adapter_dir(trios.DEMO_TASK)).modules}
    lang = {_layer(m) for m in load_adapter(experts.demo_adapter_dir(trios.DEMO_LANG)).modules}
    assert not task & lang and task | lang == set(range(LAYERS))
    assert min(task) > 0 and max(task) < LAYERS - 1      # the middle: outer layers untouched
    assert 0 in lang and LAYERS - 1 in lang


@pytest.mark.slow
@pytest.mark.parametrize("ref", list(SIDES))
def test_built_experts_equal_the_base_outside_their_layers(embedded_base, ref):
    """The dense expert built from the shipped adapter (the cached build every merge reads) is
    bit-identical to the base in every tensor outside its side; inside, its projections moved."""
    from safetensors import safe_open

    from layerswap_core.checkpoints import references

    part, side = _recipe(ref)
    arch = ARCH
    built = references.resolve(ref)
    changed, same = set(), set()
    with safe_open(str(next(built.glob("*.safetensors"))), "pt") as e, \
            safe_open(str(next(embedded_base.glob("*.safetensors"))), "pt") as b:
        for name in b.keys():
            delta = (e.get_tensor(name).float() - b.get_tensor(name).float()).abs().max().item()
            on_side = arch.classify(name).layer is not None and \
                part.model_for(name, arch) == side
            if not on_side:
                assert delta == 0, (ref, name)
                same.add(name)
            elif delta > 0:
                changed.add(arch.classify(name).layer)
    assert changed == _side_layers(part, side) and same
