"""Shared fixtures: tiny real models (built once per session) and the embedded default."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def embedded_base():
    """Folder of the embedded SmolLM2 (converted into the cache on first use, ~10 s once)."""
    from layerswap_core.checkpoints.references import DEFAULT_BASE, resolve
    return resolve(DEFAULT_BASE)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory, embedded_base):
    """dict(base=, task=, lang=): 8-layer Llama models (hidden 64, SmolLM2 tokenizer).

    task: middle layers (2..5) changed strongly; lang: layers 0, 1 and 7 changed strongly;
    all other layers changed slightly; embeddings/final norm changed slightly in both.
    Treat as read-only: copy before modifying.
    """
    from layerswap_core.testing import tiny_family
    return tiny_family(tmp_path_factory.mktemp("tiny"))


_CORES: list[int] = []   # torch's own thread count, before the suite sets one


@pytest.fixture(scope="session", autouse=True)
def suite_threads():
    """torch on one thread in the test process: on a shared 2-core machine OpenMP threads of
    tiny models spin against other processes (the browser, a server, up to 20x slower)."""
    import torch
    _CORES.append(torch.get_num_threads())
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(_CORES[0])


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for this module, whatever an earlier test left."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def all_threads():
    """Every core for one test that runs large teacher-forced batches of a real model alone
    (big matrix products, few synchronisations); one thread again after it. Not for generation:
    its many small steps on two threads ran 5x slower than on one while the CPU was shared."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(max(_CORES[0], 1))
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_lm(tiny):
    """(model, tokenizer) of the tiny base, float32 on CPU. Read-only."""
    from layerswap_core.checkpoints.loading import load_model
    return load_model(tiny["base"])
