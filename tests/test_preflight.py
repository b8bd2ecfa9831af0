"""Pre-flight from metadata alone, against a fake Hub on loopback that counts what it sends
(``fake_hub.FakeHub``). Its repositories are folders of the tiny family: ``fake/task``,
``fake/lang``, ``fake/base`` (the tiny trio), ``fake/other-vocab`` (the task expert cut to a
32,000-token vocabulary) and ``fake/other-tokenizer`` (the task expert with two tokens' ids
swapped in its tokenizer.json).
"""
from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from layerswap_core.checkpoints import hub
from layerswap_core.checkpoints.preflight import check, hub_id, preflight
from layerswap_core.checkpoints.reading import CheckpointReader, read_header

from fake_hub import SHA, FakeHub, pointed_at

MB = 10 ** 6


def _other_vocab(task: Path, out: Path, vocab: int = 32000) -> Path:
    """The task expert with its embedding (tied head) cut to ``vocab`` rows."""
    from safetensors.numpy import save_file

    shutil.copytree(task, out)
    reader = CheckpointReader(task)
    tensors = {n: reader.read_array(n) for n in reader.names()}
    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"][:vocab].copy()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["vocab_size"] = vocab
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _other_tokenizer(task: Path, out: Path) -> Path:
    """The task expert with the ids of two ordinary tokens swapped in its tokenizer.json."""
    shutil.copytree(task, out)
    tok = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[1000:1002]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (out / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    return out


def _other_eos(lang: Path, out: Path) -> Path:
    """The language expert with another EOS token named in its tokenizer_config.json."""
    shutil.copytree(lang, out)
    cfg = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    cfg["eos_token"] = "<|endoftext|>"
    (out / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def fake_hub(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("preflight-repos")
    fh = FakeHub({"fake/task": tiny["task"], "fake/lang": tiny["lang"],
                      "fake/base": tiny["base"], "fake/gated": tiny["lang"],
                      "fake/other-vocab": _other_vocab(tiny["task"], root / "other-vocab"),
                      "fake/other-tokenizer": _other_tokenizer(tiny["task"],
                                                               root / "other-tokenizer"),
                      "fake/other-eos": _other_eos(tiny["lang"], root / "other-eos")})
    with pointed_at(fh):
        yield fh


def test_a_trio_with_another_vocabulary_is_refused_from_under_a_megabyte_each(fake_hub):
    fake_hub.reset()
    pf = check("fake/base", "fake/task", "fake/other-vocab")
    assert not pf.ok
    assert pf.problems == [
        "different vocabulary sizes: lang has 32000, task has 49152",
        "tensor model.embed_tokens.weight: shape [32000, 64] in the lang (fake/other-vocab) but "
        "[49152, 64] in the task (fake/task)"]
    assert "\n" not in pf.refusal
    sent_by_repo = {r: n for r, n in fake_hub.sent.items() if r.startswith("fake/")}
    assert set(sent_by_repo) == {"fake/base", "fake/task", "fake/other-vocab"}
    for repo, sent in sent_by_repo.items():
        assert sent < 1 * MB, (repo, sent)
        whole = sum(len(b) for b in fake_hub.repos[repo].values())
        assert whole > 10 * MB                        # what a download would have fetched
    assert fake_hub.weight_bytes_fetched() == []
    assert not any(name.startswith("tokenizer") for _, name, _ in fake_hub.ranges)
    assert pf.lines()[-1] == f"refused: {pf.refusal}"


def test_a_compatible_trio_shows_sizes_and_memory_before_any_weight_byte(fake_hub, tiny, monkeypatch):
    fake_hub.reset()
    pf = check("fake/base", "fake/task", "fake/lang")
    assert pf.ok, pf.problems
    assert list(pf.models) == ["task", "lang", "base"]
    assert fake_hub.weight_bytes_fetched() == []
    # the three share one tokenizer (the same blobs): fetched once, copied for the others
    assert [r for r, n, _ in fake_hub.ranges if n == "tokenizer.json"] == ["fake/task"]
    listed = {r: sum(len(b) for b in fake_hub.repos[f"fake/{r}"].values())
              for r in ("task", "lang", "base")}
    for role, facts in pf.models.items():
        assert facts.download_bytes == listed[role]
        assert facts.info.size_bytes == (tiny[role] / "model.safetensors").stat().st_size
        assert facts.info.num_layers == 8 and facts.info.vocab_size == 49152
        assert facts.info.num_params == CheckpointReader(tiny[role]).numel()
        assert facts.license == "apache-2.0" and not facts.gated
        assert facts.fetched_bytes == fake_hub.sent[f"fake/{role}"] - _listing_bytes(fake_hub, role)
    assert pf.download_bytes == sum(listed.values())
    # the live model's copy in the dtype it runs in: a small model on the CPU is float32
    assert pf.live_float32 and pf.memory_bytes == 4 * pf.models["task"].info.num_params
    assert pf.mapped_bytes == sum(f.info.size_bytes for f in pf.models.values())
    text = "\n".join(pf.lines())
    assert "to download" in text and "memory: about" in text and "(float32 on the CPU)" in text
    assert pf.lines()[-1].startswith("compatible")
    # a bf16 checkpoint of the same model: twice its bytes on the CPU, its own bytes on a GPU
    from dataclasses import replace
    n = pf.models["task"].info.num_params
    bf16 = replace(pf, models={r: replace(f, info=replace(f.info, dtype="BF16", size_bytes=2 * n))
                               for r, f in pf.models.items()})
    assert bf16.memory_bytes == 4 * n == 2 * bf16.models["task"].info.size_bytes
    monkeypatch.setenv("LAYERSWAP_DEVICE", "cuda")
    assert not bf16.live_float32 and bf16.memory_bytes == 2 * n


def _listing_bytes(fh: FakeHub, role: str) -> int:
    return len(json.dumps(fh.listing(f"fake/{role}")).encode())


def test_a_different_tokenizer_is_refused_with_its_reason(fake_hub):
    fake_hub.reset()
    pf = check("", "fake/task", "fake/other-tokenizer")
    assert not pf.ok and len(pf.problems) == 1
    assert pf.refusal.startswith("the tokenizers of lang and task: their tokenizer.json differ: "
                                 "token ")
    assert fake_hub.weight_bytes_fetched() == []


def test_the_skeleton_headers_are_the_files_headers(fake_hub, tiny, tmp_path):
    """A weight file's header as the pre-flight fetched it parses to the file's own locations."""
    from layerswap_core.checkpoints.preflight import _Hub, _HubModel, _skeleton

    model = _HubModel("fake/task", tmp_path / "task")
    _skeleton(_Hub(None, False, hub.HubLimits(None, None, 5.0, 1)), model)
    got = read_header(model.folder / "model.safetensors")
    want = read_header(tiny["task"] / "model.safetensors")
    assert {n: loc[1:] for n, loc in got.items()} == {n: loc[1:] for n, loc in want.items()}
    assert (model.folder / "model.safetensors").stat().st_blocks * 512 < 1 * MB   # a hole


def test_refusals_in_words_and_local_folders_as_they_are(fake_hub, tiny):
    pf = check(None, "fake/task", "fake/no-such-model")
    assert pf.refusal == "lang fake/no-such-model: no public model of that name on the Hub"
    pf = preflight({"task": "fake/task", "lang": "fake/gated"}, served=True)
    assert pf.refusal == ("lang fake/gated: this model is gated or private: not downloaded on "
                          "this server")
    pf = preflight({"task": "fake/task", "lang": "fake/lang"},
                   limits=hub.HubLimits(max_download=1 * MB))
    assert pf.problems[0].startswith("task fake/task: 17.")
    assert "per model (LAYERSWAP_MAX_DOWNLOAD_GB)" in pf.problems[0]
    pf = check(str(tiny["base"]), str(tiny["task"]), "fake/lang")
    assert pf.ok and pf.models["task"].download_bytes == 0
    assert pf.models["lang"].download_bytes > 0
    assert hub_id("fake/lang") and not hub_id(str(tiny["task"])) and not hub_id("embedded:x")


def test_the_check_command_prints_the_summary_and_refuses_in_one_line(fake_hub, capsys):
    from layerswap_core.cli import main

    assert main(["check", "--base", "fake/base", "--task", "fake/task", "--lang", "fake/lang"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["task", "lang", "base", "download",
                                                    "compatible"]
    assert out[3].startswith("download: 51.9 MB in all; memory: about 13.8 MB")
    assert main(["check", "--task", "fake/task", "--lang", "fake/other-vocab"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("refused: different vocabulary sizes: lang has 32000, task has "
                              "49152; tensor model.embed_tokens.weight")
    assert main(["check", "--task", "fake/task", "--lang", "/no/such/folder"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("task: fake/task: llama (llama family, dense), 8 layers")   # what could be read
    assert out[-1] == ("refused: lang /no/such/folder: /no/such/folder: no such folder (and not "
                       "a Hub repo id of the form owner/name)")


def test_the_models_tab_preflight_with_a_visitors_rules(fake_hub, tiny, tmp_path, monkeypatch):
    """Served: a Hub id is read from its metadata (no server token, nothing downloaded into the
    served cache), a folder outside the model roots is refused, one under them is read."""
    from layerswap_core.workbench.preflight import preflight_markdown, preflight_models
    from layerswap_core.workbench.served import REFUSED, Access

    monkeypatch.setenv("HF_TOKEN", "hf_server_secret_token")
    cache = hub.HubCache(tmp_path / "served-hub", hub.HubLimits(None, None, 5.0, 1))
    before = hub.set_served_cache(cache)
    try:
        access = Access(True, tmp_path / "out", (tiny["base"].parent,), namespace="alice")
        pf = preflight_models(str(tiny["base"]), "fake/task", "fake/other-vocab", access)
        assert pf.refusal.startswith("different vocabulary sizes: lang has 32000, task has 49152")
        md = preflight_markdown(pf, access)
        assert md.startswith("**Not compatible**: different vocabulary sizes")
        assert "http" not in md and fake_hub.url not in md
        pf = preflight_models(str(tiny["base"]), "fake/task", "fake/lang", access)
        md = preflight_markdown(pf, access)
        assert pf.ok and md.startswith("**Compatible** (from their metadata")
        assert "- download: 34.6 MB in all" in md and "memory available now" in md
        assert not (tmp_path / "served-hub").exists()              # nothing downloaded
        pf = preflight_models("/etc", "fake/task", "fake/lang", access)
        assert pf.problems == [f"base /etc: {REFUSED}"]
        shutil.copytree(tiny["lang"], tmp_path / "served-hub" / "fake--lang" / SHA)
        fake_hub.reset()
        pf = preflight_models("", "fake/task", "fake/lang", access)   # lang: the served copy
        assert pf.ok and pf.models["lang"].download_bytes == 0
        assert not any(r == "fake/lang" for r, _, _ in fake_hub.ranges)
    finally:
        hub.set_served_cache(before)
    assert not any(a == "Bearer hf_server_secret_token" for a in fake_hub.auths)


def test_a_hub_pick_is_preflighted_and_downloads_only_on_download_and_use(fake_hub, tiny,
                                                                          tmp_path):
    """The Models tab's gate (``workbench.preflight.preflight_gate``, before any pick of a Hub
    model that is not here): an incompatible trio is refused with the reason after less than
    1 MB per model and no download starts; a compatible one shows its sizes and the memory
    estimate, no weight byte fetched; the pick past the gate ("Download and use") starts the
    download, and while it runs the gate lets the pick through."""
    from layerswap_core.workbench import models as wb_models
    from layerswap_core.workbench.preflight import (awaiting_download, download_line,
                                                    preflight_gate, preflight_markdown)
    from layerswap_core.workbench.served import Access

    cache = hub.HubCache(tmp_path / "served-hub", hub.HubLimits(None, None, 5.0, 1))
    before = hub.set_served_cache(cache)
    try:
        access = Access(True, tmp_path / "out", (tiny["base"].parent,), namespace="alice")
        base = str(tiny["base"])
        assert preflight_gate(base, str(tiny["task"]), str(tiny["lang"]), access) is None
        fake_hub.reset()
        pf, missing = preflight_gate(base, "fake/task", "fake/other-vocab", access)
        assert missing == ["fake/task", "fake/other-vocab"] and not pf.ok
        assert preflight_markdown(pf, access).startswith(
            "**Not compatible**: different vocabulary sizes")
        assert all(0 < fake_hub.sent[r] < MB for r in missing), fake_hub.sent
        assert not cache.jobs and not fake_hub.weight_bytes_fetched()
        fake_hub.reset()
        pf, missing = preflight_gate(base, "fake/task", "fake/lang", access)
        md = preflight_markdown(pf, access)
        assert pf.ok and "- download: 34.6 MB in all" in md and "memory" in md
        assert "**Download and use** fetches fake/task, fake/lang (0.03 GB)" in \
            download_line(pf, missing)
        assert not cache.jobs and not fake_hub.weight_bytes_fetched()
        assert not (tmp_path / "served-hub").exists()
        # "Download and use": the pick itself, which downloads them (in the background; these
        # small ones end within the pick's wait), then checks them from their files
        session, report = wb_models.open_session(base, "fake/task", "fake/lang", access=access)
        assert session is not None and report.ok
        assert fake_hub.weight_bytes_fetched()
        assert cache.cached("fake/task") is not None and cache.cached("fake/lang") is not None
        assert awaiting_download([base, "fake/task", "fake/lang"], access) == []
    finally:
        for job in list(cache.jobs.values()):
            if job.thread is not None:
                job.thread.join(30)
        hub.set_served_cache(before)


def test_check_names_a_special_token_that_differs(fake_hub, capsys):
    """`layerswap check`: ids the same, the EOS token named differently: compatible, with the
    tokenizer panel's warning and which tokenizer the merge keeps."""
    from layerswap_core.cli import main

    assert main(["check", "--task", "fake/task", "--lang", "fake/other-eos"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("warning: language expert vs task expert: eos token "
                               "'<|endoftext|>' vs ") for line in out), out
    assert "the merge writes the task expert's tokenizer files and chat template " \
           "(tokenizer_source)" in out
    assert out[-1].startswith("compatible")


def _hostile_header(nbytes: int) -> bytes:
    """A safetensors file that is all header: ``nbytes`` of JSON (one metadata string)."""
    head = b'{"__metadata__":{"pad":"'
    body = head + b"a" * (nbytes - len(head) - 3) + b'"}}'
    return struct.pack("<Q", len(body)) + body


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_weight_files_of_99_mib_headers_are_refused_from_their_lengths(tiny):
    """Three weight files of ~99 MiB headers (0.3 GB listed, far under the download cap): the
    pre-flight refuses them from their 8-byte lengths, within seconds and 100 MB."""
    from bounded import assert_bounded, run_attack

    evil = _hostile_header(99 << 20)
    fh = FakeHub({"evil/headers": {"config.json": (tiny["task"] / "config.json").read_bytes(),
                                       **{f"model-0000{i}-of-00003.safetensors": evil
                                          for i in (1, 2, 3)}},
                      "fake/lang": tiny["lang"]})
    try:
        setup = """
            from layerswap_core.checkpoints.preflight import preflight
            refs = {"task": "evil/headers", "lang": "fake/lang"}
        """
        env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": fh.url}
        r = run_attack(setup, f"preflight(refs, endpoint={fh.url!r}).refusal", env=env)
    finally:
        fh.close()
    assert_bounded(r)
    assert "task evil/headers: " in r.message and "header" in r.message, r.message
    assert sum(fh.sent.values()) < 1 * MB, fh.sent


def _moe_30b_headers() -> tuple[dict, dict, dict[str, int]]:
    """Qwen3-30B-A3B's config (the fields that size it), index and the header bytes of each of
    its 16 files, written as safetensors writes them (compact JSON, bf16, real shapes)."""
    import math

    config = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "num_experts": 128,
              "num_experts_per_tok": 8, "hidden_size": 2048, "vocab_size": 151936}
    shapes = {"model.embed_tokens.weight": [151936, 2048], "model.norm.weight": [2048],
              "lm_head.weight": [151936, 2048]}
    for layer in range(48):
        p = f"model.layers.{layer}."
        shapes.update({p + "self_attn.q_proj.weight": [4096, 2048],
                       p + "self_attn.k_proj.weight": [512, 2048],
                       p + "self_attn.v_proj.weight": [512, 2048],
                       p + "self_attn.o_proj.weight": [2048, 4096],
                       p + "self_attn.q_norm.weight": [128], p + "self_attn.k_norm.weight": [128],
                       p + "input_layernorm.weight": [2048],
                       p + "post_attention_layernorm.weight": [2048],
                       p + "mlp.gate.weight": [128, 2048]})
        for e in range(128):
            for w, shape in (("gate_proj", [768, 2048]), ("up_proj", [768, 2048]),
                             ("down_proj", [2048, 768])):
                shapes[f"{p}mlp.experts.{e}.{w}.weight"] = shape
    names = list(shapes)
    files = [f"model-{i:05d}-of-00016.safetensors" for i in range(1, 17)]
    weight_map = {n: files[i * 16 // len(names)] for i, n in enumerate(names)}
    headers: dict[str, dict] = {f: {"__metadata__": {"format": "pt"}} for f in files}
    offsets = dict.fromkeys(files, 0)
    for n in names:
        f, size = weight_map[n], math.prod(shapes[n]) * 2
        headers[f][n] = {"dtype": "BF16", "shape": shapes[n],
                         "data_offsets": [offsets[f], offsets[f] + size]}
        offsets[f] += size
    return config, {"weight_map": weight_map}, {
        f: len(json.dumps(h, separators=(",", ":"))) for f, h in headers.items()}


def test_the_header_caps_let_a_30b_mixture_of_experts_through():
    """The caps are sized from a real model: Qwen3-30B-A3B's 18,867 tensors in 16 files (2.4 MB
    of headers) pass every one with room; a file's header ten times its tensors' needs not."""
    from layerswap_core.checkpoints import preflight as pre

    config, index, sizes = _moe_30b_headers()
    assert len(index["weight_map"]) == 18867 and len(sizes) == 16
    assert 2.2 * MB < sum(sizes.values()) < 2.6 * MB
    allowed = pre.header_allowance(index, list(sizes))
    assert all(sizes[f] * 4 < allowed[f] for f in sizes)          # 148 kB each against ~1.2 MB
    assert sum(sizes.values()) * 6 < pre.HEADER_TOTAL_MAX
    assert 18867 < pre.tensor_allowance(config) < 2 * 18867
    assert len(sizes) * 10 < pre.MAX_WEIGHT_FILES
    assert pre.header_allowance(None, ["model.safetensors"]) == {
        "model.safetensors": pre.HEADER_FILE_MAX}


def test_too_many_weight_files_too_many_tensors_and_a_slow_hub_are_refused(tiny, monkeypatch):
    """More weight files than any model: refused from the listing, no file read; more tensors
    than the config's layers explain: refused; a pre-flight past its deadline: refused."""
    from safetensors.numpy import save

    from layerswap_core.checkpoints import preflight as pre

    config = (tiny["task"] / "config.json").read_bytes()
    empty = save({})
    many = save({f"t{i}": np.zeros(1, np.float32) for i in range(900)})
    repos = {"evil/files": {"config.json": config,
                            **{f"w{i:04d}.safetensors": empty for i in range(300)}},
             "evil/tensors": {"config.json": config, "model.safetensors": many},
             "fake/task": tiny["task"]}
    with pointed_at(FakeHub(repos)) as fh:
        pf = preflight({"task": "evil/files"}, endpoint=fh.url)
        assert pf.problems == ["task evil/files: 300 weight files: a pre-flight reads at most "
                               "256 per model (no model needs more): refused"]
        assert not fh.ranges
        pf = preflight({"task": "evil/tensors"}, endpoint=fh.url)   # 8 layers: 768 at most
        assert pf.problems == ["task evil/tensors: the weight files list over 768 tensors, more "
                               "than its config.json has layers and experts for: refused"]
        assert preflight({"task": "fake/task"}, endpoint=fh.url).ok
        monkeypatch.setattr(pre, "PREFLIGHT_SECONDS", 0.0)
        pf = preflight({"task": "fake/task"}, endpoint=fh.url)
        assert pf.problems == ["task fake/task: the pre-flight ran past 0 s (the Hub answers too "
                               "slowly); try again later"]


def test_deeply_nested_json_in_a_model_is_one_line_not_a_traceback(tiny, tmp_path, capsys):
    """config.json, tokenizer_config.json, tokenizer.json and a safetensors header nested
    100,000 deep (Python's parser recurses per level): `layerswap check` refuses in one line."""
    from layerswap_core.cli import main

    deep = "[" * 100_000 + "]" * 100_000
    for name in ("config.json", "tokenizer_config.json", "tokenizer.json", "model.safetensors"):
        lang = tmp_path / name / "lang"
        shutil.copytree(tiny["lang"], lang)
        if name == "model.safetensors":
            (lang / name).write_bytes(struct.pack("<Q", len(deep)) + deep.encode())
        else:
            (lang / name).write_text(deep)
        assert main(["check", "--task", str(tiny["task"]), "--lang", str(lang)]) == 1, name
        out = capsys.readouterr()
        assert "Traceback" not in out.err and "RecursionError" not in out.out.replace(
            "cannot be read (RecursionError)", ""), (name, out)
        assert out.out.splitlines()[-1].startswith("refused: "), (name, out.out)
        assert "nested too deeply" in out.out or "cannot be read (RecursionError)" in out.out, \
            (name, out.out)
