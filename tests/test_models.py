import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from layerswap_core.checkpoints import embedded, loading, reading, references, tokenizers
from layerswap_core.checkpoints.reading import CheckpointError, CheckpointReader
from layerswap_core.checkpoints.references import ModelLoadError, resolve
from layerswap_core.checkpoints.loading import describe, load_model
from layerswap_core.checkpoints.compatibility import compatibility


def test_local_folder_resolves_and_describes(tiny):
    assert resolve(tiny["base"]) == tiny["base"].resolve()
    info = describe(tiny["base"])
    assert (info.model_type, info.num_layers, info.hidden_size) == ("llama", 8, 64)
    assert info.tied_embeddings and info.num_params > 0 and info.dtype == "F32"


def test_nonexistent_path(tmp_path):
    with pytest.raises(ModelLoadError, match="no such folder"):
        resolve(tmp_path / "missing")
    with pytest.raises(ModelLoadError, match="no such folder"):
        resolve("./not/here/at/all")


def test_folder_without_weights(tmp_path, tiny):
    shutil.copy(tiny["base"] / "config.json", tmp_path / "config.json")
    with pytest.raises(ModelLoadError, match="no weights"):
        resolve(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve(tmp_path)


def test_bin_only_checkpoint_refused_then_converted(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "binmodel"
    src.mkdir()
    for f in tiny["base"].iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, src / f.name)
    ref = CheckpointReader(tiny["base"])
    torch.save({n: ref.get(n) for n in ref.names()}, src / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="allow_bin"):
        resolve(src)
    out = resolve(src, allow_bin=True)
    conv = CheckpointReader(out)
    assert sorted(conv.names()) == sorted(ref.names())
    for n in ref.names():
        assert torch.equal(conv.get(n), ref.get(n))
    model, tok = load_model(src, allow_bin=True)
    assert model.config.num_hidden_layers == 8
    # a malicious pickle (not plain tensors) is refused by weights_only=True
    shutil.rmtree(tmp_path / "cache")
    torch.save({"x": subprocess.Popen}, src / "pytorch_model.bin")  # a pickled global
    with pytest.raises(Exception, match="weights_only|Unsupported global"):
        resolve(src, allow_bin=True)


def test_repo_id_while_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="offline"):
        resolve("someone/some-model-that-is-not-cached")


def test_repo_id_from_local_hub_cache(tmp_path, monkeypatch, tiny):
    """A local folder laid out as a Hub cache snapshot stands in for the Hub."""
    from huggingface_hub import constants

    snap = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / ("a" * 40)
    shutil.copytree(tiny["base"], snap)
    (tmp_path / "hub" / "models--acme--tiny-llama" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny-llama" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = resolve("acme/tiny-llama")
    assert path == snap and describe("acme/tiny-llama").num_layers == 8


def test_adapter_folder_and_file_refused(tmp_path, tiny):
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="adapter"):
        resolve(tmp_path)
    with pytest.raises(ModelLoadError, match="is a file"):
        resolve(tiny["base"] / "config.json")


def test_trust_remote_code_off_by_default(tmp_path, tiny):
    d = tmp_path / "remote"
    shutil.copytree(tiny["base"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "totally_custom_lm"
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomLM",
                       "AutoConfig": "configuration_custom.CustomConfig"}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "modeling_custom.py").write_text("raise RuntimeError('remote code must not run')\n")
    (d / "configuration_custom.py").write_text("raise RuntimeError('remote code must not run')\n")
    with pytest.raises(ModelLoadError):
        load_model(d)


def test_corrupt_safetensors(tmp_path, tiny):
    d = tmp_path / "corrupt"
    shutil.copytree(tiny["base"], d)
    (d / "model.safetensors").write_bytes(b"\x00\x01not a safetensors file")
    with pytest.raises(CheckpointError, match="cannot read"):
        CheckpointReader(d)


def test_compatibility(tiny, tmp_path):
    assert compatibility({"base": tiny["base"], "task": tiny["task"], "lang": tiny["lang"]}) == []
    from layerswap_core.testing import make_tiny_model
    other = make_tiny_model(tmp_path / "other", num_layers=6)
    problems = compatibility({"task": tiny["task"], "lang": other})
    assert problems and "6 layers" in problems[0]


def test_unknown_embedded_name():
    with pytest.raises(ModelLoadError, match="unknown embedded model"):
        resolve("embedded:nope")


@pytest.mark.slow
def test_embedded_default_loads_from_cache_and_chats(embedded_base, monkeypatch):
    """Once converted, loading reads the cache (the GGUF converter is not called) and chats.

    The load time itself (< 2 s target) is measured by bench/load_bench.py.
    """
    def refuse(*a, **k):
        raise AssertionError("the embedded model was converted again instead of read from cache")

    emb = embedded.EMBEDDED["smollm2-135m-instruct"]
    monkeypatch.setattr(emb, "build", refuse)
    model, tok = load_model(references.DEFAULT_BASE)
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer


# --------------------------------------------------------------------------- one set of weights
Q = "model.layers.2.self_attn.q_proj.weight"


def _bin_beside(folder, weights_from):
    """Write weights_from's tensors as a pytorch_model.bin into folder (different weights)."""
    other = CheckpointReader(weights_from)
    torch.save({n: other.get(n) for n in other.names()}, folder / "pytorch_model.bin")


@pytest.mark.parametrize("layout", ["model.safetensors", "other name", "index beside a stale file"])
def test_load_model_reads_the_safetensors_that_merge_reads(tmp_path, tiny, monkeypatch, layout):
    """A .bin (or a stale model.safetensors) lying beside the weights is never what gets loaded:
    load_model gives exactly the tensors CheckpointReader (merge, analysis) reads."""
    from huggingface_hub import save_torch_state_dict

    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "cache"))
    d = Path(shutil.copytree(tiny["base"], tmp_path / "m"))
    _bin_beside(d, tiny["lang"])
    if layout == "other name":
        (d / "model.safetensors").rename(d / "weights.safetensors")
    elif layout == "index beside a stale file":  # the index names the task's weights
        task = CheckpointReader(tiny["task"])
        save_torch_state_dict({n: task.get(n) for n in task.names()}, d, max_shard_size="300KB")
        shutil.copy(Path(tiny["base"]) / "model.safetensors", d)  # (it removed the file it saw)
        assert (d / "model.safetensors").exists() and (d / reading.INDEX_NAME).exists()
    want = CheckpointReader(d).get(Q)
    assert not torch.equal(want, CheckpointReader(tiny["lang"]).get(Q))
    model, _ = load_model(d)
    assert torch.equal(model.state_dict()[Q], want)
    assert "transformers_weights" not in model.config.to_dict()
    assert not (tmp_path / "cache" / "from_bin").exists()  # the .bin was not even converted


def test_several_safetensors_without_index_refused_by_load_model(tmp_path, tiny):
    d = Path(shutil.copytree(tiny["base"], tmp_path / "m"))
    shutil.copy(d / "model.safetensors", d / "extra.safetensors")
    with pytest.raises(ModelLoadError, match="2 \\*.safetensors files but no"):
        load_model(d)


@pytest.mark.parametrize("damage", ["truncated", "header too large", "empty"])
def test_damaged_checkpoint_is_a_load_error_naming_the_file(tmp_path, tiny, damage):
    d = Path(shutil.copytree(tiny["base"], tmp_path / "m"))
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes({"truncated": data[: len(data) // 2],
                   "header too large": (10 ** 12).to_bytes(8, "little") + b"{}",
                   "empty": b""}[damage])
    with pytest.raises(ModelLoadError, match=str(f).replace(".", r"\.")):
        load_model(d)


def test_invalid_config_json_names_the_file(tmp_path, tiny):
    d = Path(shutil.copytree(tiny["base"], tmp_path / "m"))
    for text, why in (("{not json", "not valid JSON"), ("[1, 2]", "not a JSON object")):
        (d / "config.json").write_text(text)
        for call in (resolve, describe, reading.read_config_file,
                     lambda p: CheckpointReader(p).config(),
                     load_model):
            with pytest.raises(ModelLoadError, match=why) as e:
                call(d)
            assert str(d / "config.json") in str(e.value)


# --------------------------------------------------------------------------- tokenizer identity
def _slow_tokenizer(model_dir, dst, edit=None):
    """Copy of model_dir whose tokenizer is vocab.json + merges.txt (no tokenizer.json), written
    from the same tokenizer.json content; ``edit(vocab)`` changes the vocabulary."""
    d = Path(shutil.copytree(model_dir, dst))
    tok = json.loads((d / "tokenizer.json").read_text())
    (d / "tokenizer.json").unlink()
    vocab = dict(tok["model"]["vocab"])
    if edit:
        edit(vocab)
    (d / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    (d / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return d


def _swap_two_tokens(vocab):
    a, b = "hello", "world"
    vocab[a], vocab[b] = vocab[b], vocab[a]


def test_vocab_json_tokenizers_are_compared(tmp_path, tiny):
    from layerswap_core.merge.executor import MergeError, open_inputs

    same = _slow_tokenizer(tiny["task"], tmp_path / "same")
    other = _slow_tokenizer(tiny["lang"], tmp_path / "other", _swap_two_tokens)
    # one tokenizer in both formats is the same tokenizer
    assert compatibility({"task": same, "lang": tiny["lang"]}) == []
    assert tokenizers.vocab_fingerprint(same) == tokenizers.vocab_fingerprint(tiny["lang"])
    # same size, two tokens swapped: refused, in vocab.json form and across the formats
    problems = compatibility({"task": same, "lang": other})
    assert len(problems) == 1 and "vocab.json+merges.txt differ" in problems[0]
    assert "vocabularies differ" in compatibility({"task": tiny["task"], "lang": other})[0]
    with pytest.raises(MergeError, match="tokenizers"):
        open_inputs(same, other)


def test_tokenizer_merges_and_sentencepiece_files_are_compared(tmp_path, tiny):
    d = Path(shutil.copytree(tiny["lang"], tmp_path / "merges"))
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["model"]["merges"] = tok["model"]["merges"][::-1]  # same tokens, other merge order
    (d / "tokenizer.json").write_text(json.dumps(tok))
    assert "tokenizer.json differ" in compatibility({"task": tiny["task"], "lang": d})[0]

    spm = {}
    for name, content in (("a", b"\x0a\x05piece-a"), ("b", b"\x0a\x05piece-b")):
        spm[name] = Path(shutil.copytree(tiny["task"], tmp_path / f"spm-{name}"))
        (spm[name] / "tokenizer.json").unlink()
        (spm[name] / "tokenizer.model").write_bytes(content)
    assert "tokenizer.model differ" in compatibility({"task": spm["a"], "lang": spm["b"]})[0]
    why = compatibility({"task": tiny["task"], "lang": spm["a"]})[0]
    assert "cannot be compared" in why and "tokenizer.model" in why and "tokenizer.json" in why
    # no tokenizer files on one side: nothing to compare, not a difference
    bare = Path(shutil.copytree(tiny["lang"], tmp_path / "bare"))
    for f in tokenizers.TOKENIZER_FILES:
        (bare / f).unlink(missing_ok=True)
    assert compatibility({"task": tiny["task"], "lang": bare}) == []


def test_merge_inputs_use_the_same_tokenizer_check_as_the_models_tab(tmp_path, tiny):
    """open_inputs (merge, analysis, app) asks tokenizers.tokenizer_difference: one tokenizer saved in
    both formats merges; a tokenizer.json + tokenizer.model folder against a tokenizer.model-only
    folder with the same file is the same tokenizer."""
    from layerswap_core.merge.executor import open_inputs

    same = _slow_tokenizer(tiny["task"], tmp_path / "same")
    assert open_inputs(tiny["task"], same).names
    both = Path(shutil.copytree(tiny["task"], tmp_path / "both"))
    only = Path(shutil.copytree(tiny["lang"], tmp_path / "only"))
    for d in (both, only):
        (d / "tokenizer.model").write_bytes(b"\x0a\x05piece-a")
    (only / "tokenizer.json").unlink()
    assert compatibility({"task": both, "lang": only}) == []
    assert open_inputs(both, only).names


def test_free_space_is_checked_before_a_download_or_a_save(tmp_path):
    import shutil as sh

    free = sh.disk_usage(tmp_path).free
    references.check_free_space(tmp_path / "not" / "yet", 1024, "downloading x")  # plenty of room
    with pytest.raises(references.ModelLoadError, match=r"downloading x needs .* GiB but .* free"):
        references.check_free_space(tmp_path / "not" / "yet", free * 2, "downloading x")
    assert not (tmp_path / "not").exists()   # said before anything is written


def test_hub_download_bars_report_to_the_page(capsys):
    said = []
    bar_class = references._reporting_tqdm(lambda fraction, message: said.append((fraction, message)))
    bar = bar_class(total=3 * 2**30, unit="B", desc="model.safetensors", disable=False)
    bar.update(2**30)
    bar.close()
    assert said and said[-1] == (pytest.approx(1 / 3), "model.safetensors: 1.00 GiB of 3.00 GiB")


def test_one_device_picker_for_the_app_and_the_library(monkeypatch):
    import torch

    monkeypatch.delenv("LAYERSWAP_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() and not loading.ZERO_GPU else "cpu"
    assert loading.pick_device() == loading.pick_device("auto") == expected
    monkeypatch.setenv("LAYERSWAP_DEVICE", "cpu")
    assert loading.pick_device() == "cpu" and loading.pick_device("cpu") == "cpu"
    if not torch.cuda.is_available():
        monkeypatch.setenv("LAYERSWAP_DEVICE", "cuda")
        with pytest.raises(references.ModelLoadError, match="no CUDA GPU"):
            loading.pick_device()


def test_one_gguf_parse_per_conversion_gives_what_gguf_itself_reads():
    """Inside a conversion every GGUFReader of one file is the same reader, over a plain array
    (not numpy's slow memmap subclass), with the fields and tensor bytes gguf's own reader
    gives; transformers' metadata parse runs once; afterwards, or after an error, both
    functions are gguf's and transformers' own again."""
    import gguf
    import numpy as np
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    path = embedded.smollm2_gguf_path()
    own_reader, own_parse = gguf.GGUFReader, gguf_utils.load_gguf_checkpoint
    plain = gguf.GGUFReader(path)
    with embedded._gguf_read_once():
        first, again = gguf.GGUFReader(path), gguf.GGUFReader(str(path))
        assert first is again and type(first.data) is np.ndarray
        assert list(first.fields) == list(plain.fields)
        for key, field in plain.fields.items():
            assert all(np.array_equal(a, b) for a, b in zip(field.parts, first.fields[key].parts))
        assert [(t.name, t.tensor_type) for t in first.tensors] == \
            [(t.name, t.tensor_type) for t in plain.tensors]
        assert all(np.array_equal(a.data, b.data) for a, b in zip(first.tensors, plain.tensors))
        meta = gguf_utils.load_gguf_checkpoint(path, return_tensors=False)
        meta["config"]["num_hidden_layers"] = -1      # a caller changing its copy
        later = gguf_utils.load_gguf_checkpoint(path)
        assert later["config"]["num_hidden_layers"] == 30
        assert later["tokenizer"] is meta["tokenizer"]   # parsed once, not again
    assert (gguf.GGUFReader, gguf_utils.load_gguf_checkpoint) == (own_reader, own_parse)
    with pytest.raises(RuntimeError):
        with embedded._gguf_read_once():
            raise RuntimeError("a failed conversion")
    assert (gguf.GGUFReader, gguf_utils.load_gguf_checkpoint) == (own_reader, own_parse)


@pytest.mark.slow
def test_gguf_converter_rebuilds_the_embedded_default_identically(embedded_base, tmp_path, monkeypatch):
    """The converter the embedded models share (GGUF -> transformers -> bf16 safetensors) gives,
    in a fresh cache, the same tensors, config and tokenizer as the cached SmolLM2."""
    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "cache"))
    fresh = resolve(references.DEFAULT_BASE)
    assert fresh != embedded_base and fresh.parent.parent == tmp_path / "cache"
    old, new = CheckpointReader(embedded_base), CheckpointReader(fresh)
    assert sorted(old.names()) == sorted(new.names())
    for n in old.names():
        assert torch.equal(old.get(n), new.get(n)), n
    assert json.loads((fresh / "config.json").read_text()) == \
        json.loads((embedded_base / "config.json").read_text())
    assert (fresh / "tokenizer.json").read_bytes() == (embedded_base / "tokenizer.json").read_bytes()
    assert "Apache-2.0" in (fresh / "LICENSE.txt").read_text()
