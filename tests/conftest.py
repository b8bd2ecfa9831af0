"""Shared fixtures: tiny real models (built once per session) and the embedded default."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
from mgsm_fixture import write_mgsm_fixture   # tests/ is on sys.path (pytest's rootdir conftest)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _real_mgsm_dir():
    """The real MGSM folder on this machine ($LAYERSWAP_MGSM_DIR, ../shared/data/mgsm or the
    cache), looked for before the suite points that variable at its own fixture; or None."""
    from layerswap_core.evaluation.data import DataError, local_mgsm_dir
    try:
        return local_mgsm_dir()
    except DataError:
        return None


# Every MGSM code path runs on the suite's own MGSM-format folder (tests/mgsm_fixture.py), on
# every machine: the same tests pass with or without ../shared. Subprocesses (served apps, the
# CLI, the browser tests' server) inherit the variable.
REAL_MGSM_DIR = _real_mgsm_dir()
_FIXTURE_ROOT = tempfile.mkdtemp(prefix="layerswap-mgsm-fixture-")
atexit.register(shutil.rmtree, _FIXTURE_ROOT, True)
MGSM_FIXTURE_DIR = write_mgsm_fixture(os.path.join(_FIXTURE_ROOT, "mgsm"))
os.environ["LAYERSWAP_MGSM_DIR"] = str(MGSM_FIXTURE_DIR)


def pytest_collection_modifyitems(items):
    """Tests taking ``real_mgsm`` carry the marker of that name (`.ci/run` selects them)."""
    for item in items:
        if "real_mgsm" in getattr(item, "fixturenames", ()):
            item.add_marker("real_mgsm")


@pytest.fixture
def real_mgsm(monkeypatch):
    """The real MGSM folder, for the few checks of MGSM's own content (docs/development.md
    names them); they skip, with the reason, where the data is not on this machine."""
    if REAL_MGSM_DIR is None:
        pytest.skip("needs MGSM's real files (../shared/data/mgsm, $LAYERSWAP_MGSM_DIR or the "
                    "cache): not shipped, CC BY-SA 4.0")
    monkeypatch.setenv("LAYERSWAP_MGSM_DIR", str(REAL_MGSM_DIR))
    return REAL_MGSM_DIR


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


@pytest.fixture
def freedict():
    """Debian's FreeDict Swahili<->English dictionaries (the Swahili reading recipe's
    exercises): not on PyPI; `.ci/run` installs them, elsewhere the test skips saying so."""
    from layerswap_core.demos import recipes
    missing = [f"{stem}{ext}" for stem in recipes.FREEDICT_FILES.values()
               for ext in (".index", ".dict.dz") if not (recipes.FREEDICT_DIR / f"{stem}{ext}").exists()]
    if missing:
        pytest.skip("needs the Debian packages dict-freedict-swh-eng and dict-freedict-eng-swh "
                    f"(apt-get install them; .ci/run does): {', '.join(missing)} missing")
