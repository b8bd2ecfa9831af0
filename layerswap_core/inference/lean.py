"""A lean Llama for evaluation on the CPU: transformers' ``LlamaForCausalLM`` forward pass and
its tokenizer, rebuilt from the checkpoint's files with torch and ``tokenizers`` alone.

Why: importing transformers' model and tokenizer code costs about 4.5 s on this 2-core machine
(its own imports pull in ``torch._dynamo``, ``torch.distributed.tensor``, sympy and scipy), a
tenth of an English chain-of-thought run of ``layerswap eval``; and its modules add Python work
to every one of a run's ~200 decoding passes. ``LeanLlama`` does the same arithmetic in the same
order (RMSNorm in float32, rotary embedding, the attention of transformers' ``sdpa`` path and its
masks, SiLU MLP), so its logits equal transformers' bit for bit (``tests/test_lean.py``) and every
generated text is the same. Its modules keep transformers' names and classes (``nn.Linear``
projections), so ``products.packed_products`` and ``split_head`` work on it unchanged.

It is used only where that equality is known to hold: ``lean_reason`` names what keeps a
checkpoint off it (anything but a plain Llama config with default rotary embedding, a tokenizer
that is not a plain tokenizer.json, a device other than the CPU), and the caller then loads it
through transformers as before. Only what evaluation calls is here: ``forward`` with a KV cache
(``LeanCache``, transformers' ``DynamicCache`` as far as ``prefill`` and ``decoding`` use it);
no ``generate``, no training, no chat template.

It is the default path of ``layerswap eval`` (``runner.run_side_by_side(lean=True)``; the
command's ``--transformers`` turns it off), kept for that start-up and checked bit for bit
against transformers by ``tests/test_lean.py`` (logits, token ids and text, generations, gold
NLLs, and a run of ``layerswap eval`` that never imports transformers).
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from ..checkpoints.architectures import tied_embeddings
from ..checkpoints.loading import pick_device
from ..checkpoints.reading import CheckpointReader, read_config_file
from ..checkpoints.references import resolve
from .attention import lean_attention

__all__ = ["NOT_PLAIN_ARGMAX", "LeanCache", "LeanConfig", "LeanLayer", "LeanLlama",
           "LeanTokenizer", "lean_reason", "load_lean", "load_lean_model", "plain_argmax"]

# config fields that must hold these values (or be absent) for the lean forward to equal
# transformers' LlamaForCausalLM; any other value sends the model through transformers
_CONFIG_PLAIN = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
                 "pretraining_tp": 1, "attention_dropout": 0.0, "quantization_config": None}
_CONFIG_NEEDED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "rms_norm_eps")
# tokenizer_config.json keys that do not change what transformers' tokenizer backend encodes
# or decodes from tokenizer.json (any other key sends the model through transformers)
_TOKENIZER_KEYS = {"backend", "bos_token", "eos_token", "pad_token", "unk_token", "is_local",
                   "local_files_only", "model_max_length", "tokenizer_class",
                   "clean_up_tokenization_spaces", "added_tokens_decoder", "chat_template",
                   "extra_special_tokens", "additional_special_tokens", "model_input_names",
                   "padding_side", "truncation_side", "split_special_tokens"}
_TOKENIZER_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}
# generation_config fields that change what greedy decoding picks, with their neutral values:
# a model whose config sets one of them decodes through transformers' generate, which applies it
NOT_PLAIN_ARGMAX = {
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "min_length": 0,
    "min_new_tokens": None, "suppress_tokens": None, "begin_suppress_tokens": None,
    "forced_bos_token_id": None, "forced_eos_token_id": None, "sequence_bias": None,
    "exponential_decay_length_penalty": None, "guidance_scale": None, "watermarking_config": None,
    "num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None, "dola_layers": None,
    "stop_strings": None, "max_time": None, "token_healing": False,
}


def plain_argmax(generation_config) -> bool:
    """Whether greedy decoding under this generation_config (an object, a dict or None) is a
    plain argmax: none of ``NOT_PLAIN_ARGMAX`` is set to anything but its neutral value."""
    if isinstance(generation_config, dict):
        generation_config = SimpleNamespace(**generation_config)
    return generation_config is None or all(
        getattr(generation_config, key, None) in (neutral, None)
        for key, neutral in NOT_PLAIN_ARGMAX.items())


def _rope_theta(cfg: dict) -> float | None:
    """The rotary base of a default (unscaled) rotary embedding, else None."""
    rp = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    if not isinstance(rp, dict) or not isinstance(scaling, dict):
        return None
    kind = rp.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default" or "partial_rotary_factor" in rp:
        return None
    theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    return float(theta) if isinstance(theta, (int, float)) else None


def lean_reason(folder: str | Path, device: str = "cpu") -> str | None:
    """None if ``LeanLlama`` can stand in for transformers on this checkpoint folder, else why
    not (one line)."""
    return _checked(Path(folder), device)[0]


def _checked(folder: Path, device: str):
    """(``lean_reason``, the parsed tokenizer.json where it was read), so that loading does
    not parse it again."""
    if str(device) != "cpu":
        return f"device {device}: the lean forward runs on the CPU only", None
    try:
        cfg = read_config_file(folder)
    except (ValueError, OSError) as e:
        return f"config: {e}", None
    reason = _config_reason(folder, cfg)
    if reason is not None:
        return reason, None
    tok = folder / "tokenizer.json"
    if not tok.is_file():
        return "no tokenizer.json", None
    try:
        tcfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no readable tokenizer_config.json", None
    extra = sorted(set(tcfg) - _TOKENIZER_KEYS)
    if extra:
        return f"tokenizer_config sets {', '.join(extra)}", None
    if tcfg.get("tokenizer_class") not in _TOKENIZER_CLASSES:
        return f"tokenizer class {tcfg.get('tokenizer_class')!r}", None
    if tcfg.get("clean_up_tokenization_spaces") or tcfg.get("split_special_tokens"):
        return "tokenizer cleans up spaces or splits special tokens", None
    from tokenizers import Tokenizer

    try:
        parsed = Tokenizer.from_file(str(tok))
    except Exception as e:  # noqa: BLE001 - any unreadable tokenizer.json keeps it off
        return f"tokenizer.json unreadable ({e})", None
    return _special_tokens_reason(parsed, tcfg), parsed


def _config_reason(folder: Path, cfg: dict) -> str | None:
    """What in config.json or generation_config.json keeps the folder off the lean forward."""
    if cfg.get("model_type") != "llama" or cfg.get("architectures", ["LlamaForCausalLM"]) != [
            "LlamaForCausalLM"]:
        return f"model type {cfg.get('model_type')!r}: only plain Llama checkpoints"
    for key, value in _CONFIG_PLAIN.items():
        if cfg.get(key, value) != value:
            return f"config {key}={cfg.get(key)!r}"
    missing = [k for k in _CONFIG_NEEDED if not isinstance(cfg.get(k), (int, float))]
    if missing:
        return f"config lacks {', '.join(missing)}"
    if _rope_theta(cfg) is None:
        return "rotary embedding is scaled (only the default one is rebuilt)"
    if cfg.get("num_attention_heads") % cfg.get("num_key_value_heads", cfg["num_attention_heads"]):
        return "query heads are not a multiple of key/value heads"
    try:
        gen = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        gen = {}
    except (OSError, ValueError):
        return "unreadable generation_config.json"
    if not plain_argmax(gen):
        changed = [k for k, v in NOT_PLAIN_ARGMAX.items() if gen.get(k) not in (v, None)]
        return f"generation_config sets {', '.join(changed)} (transformers' generate applies it)"
    return None


def _role_tokens(tcfg: dict) -> dict:
    """role (bos, eos, pad, unk) -> its token string in tokenizer_config.json, or None."""
    out = {}
    for role in ("bos", "eos", "pad", "unk"):
        token = tcfg.get(f"{role}_token")
        out[role] = token.get("content") if isinstance(token, dict) else token
    return out


def _special_tokens_reason(tok, tcfg: dict) -> str | None:
    """Why the special tokens of tokenizer_config.json would not be what transformers makes of
    them (it adds a missing one to the vocabulary, and skips it in decoding as special), else
    None: each must already be a special added token of tokenizer.json (``tok``, parsed)."""
    added = tok.get_added_tokens_decoder()
    for role, token in _role_tokens(tcfg).items():
        if token is None:
            continue
        i = tok.token_to_id(token)
        if i is None or i not in added or not added[i].special:
            return f"{role} token {token!r} is not a special token of tokenizer.json"
    return None


class LeanTokenizer:
    """transformers' tokenizer backend over tokenizer.json, as far as evaluation uses it: the
    same ids for ``tokenizer(text, add_special_tokens=...)`` and ``encode``, the same text for
    ``decode`` / ``batch_decode``, and the special token ids of tokenizer_config.json."""

    def __init__(self, folder: str | Path, parsed=None):
        """``parsed``: tokenizer.json already read (``tokenizers.Tokenizer``), else read here."""
        from tokenizers import Tokenizer

        folder = Path(folder)
        self._tokenizer = parsed or Tokenizer.from_file(str(folder / "tokenizer.json"))
        tcfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        self.name_or_path = str(folder)
        for role, token in _role_tokens(tcfg).items():
            setattr(self, f"{role}_token", token)
            setattr(self, f"{role}_token_id",
                    None if token is None else self._tokenizer.token_to_id(token))

    def __call__(self, text: str, add_special_tokens: bool = True, **kw) -> dict:
        if kw:
            raise TypeError(f"LeanTokenizer takes no {', '.join(kw)}")
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if isinstance(ids, int):
            ids = [ids]
        elif isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, rows, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(r, skip_special_tokens=skip_special_tokens) for r in rows]

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)


class LeanLayer:
    """One layer of ``LeanCache``: transformers' ``DynamicLayer`` as prefill and generation use
    it (keys and values [batch, heads, seq, dim], grown by concatenation)."""

    is_sliding = False

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.is_initialized = False

    def update(self, key_states, value_states, *args, **kwargs):
        if self.keys is None:
            self.keys, self.values = key_states, value_states
        else:
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
        self.is_initialized = True
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self.keys, self.values = self.keys[indices, ...], self.values[indices, ...]


class LeanCache:
    """The KV cache of ``LeanLlama``: a list of layers (``LeanLayer`` or ``prefill``'s growing
    ones), made like transformers' ``DynamicCache`` (``ddp_cache_data``: (keys, values) per
    layer)."""

    def __init__(self, ddp_cache_data=None, config=None):
        self.layers: list = []
        for k, v in ddp_cache_data or ():
            layer = LeanLayer()
            layer.update(k, v)
            self.layers.append(layer)

    def update(self, key_states, value_states, layer_idx: int):
        while len(self.layers) <= layer_idx:
            self.layers.append(LeanLayer())
        return self.layers[layer_idx].update(key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_seq_length() if layer_idx < len(self.layers) else 0

    def batch_repeat_interleave(self, repeats: int) -> None:
        for layer in self.layers:
            layer.batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for layer in self.layers:
            layer.batch_select_indices(indices)


class _Norm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, device="meta"))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # transformers' LlamaRMSNorm
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * x.to(dtype)


def _linear(n_in: int, n_out: int) -> nn.Linear:
    """A bias-free ``nn.Linear`` on the meta device (its weight comes from the checkpoint)."""
    return nn.Linear(n_in, n_out, bias=False, device="meta")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Attention(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.layer_idx, self.head_dim = layer_idx, d
        self.num_key_value_groups = cfg.num_attention_heads // cfg.num_key_value_heads
        self.scaling = d ** -0.5
        self.q_proj = _linear(h, cfg.num_attention_heads * d)
        self.k_proj = _linear(h, cfg.num_key_value_heads * d)
        self.v_proj = _linear(h, cfg.num_key_value_heads * d)
        self.o_proj = _linear(cfg.num_attention_heads * d, h)

    def forward(self, x, cos, sin, mask, cache):
        shape = (*x.shape[:-1], -1, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        out = lean_attention(q, k, v, mask, self.num_key_value_groups, self.scaling)
        return self.o_proj(out.reshape(*x.shape[:-1], -1).contiguous())


class _MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = _linear(cfg.hidden_size, cfg.intermediate_size)
        self.up_proj = _linear(cfg.hidden_size, cfg.intermediate_size)
        self.down_proj = _linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        self.self_attn = _Attention(cfg, layer_idx)
        self.mlp = _MLP(cfg)
        self.input_layernorm = _Norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = _Norm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LeanConfig(SimpleNamespace):
    """config.json's fields as attributes (what ``products`` and ``generation`` read)."""

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


def _causal_mask(attention_mask: torch.Tensor | None, past: int, q_len: int, batch: int):
    """The boolean mask [batch, 1, q_len, past + q_len] that transformers' ``sdpa_mask`` builds
    (key j seen by query i iff j <= past + i and the 2D mask keeps j), or None where it leaves
    the mask to ``is_causal`` (nothing padded, and one query or no past)."""
    kv = past + q_len
    pad = None
    if attention_mask is not None:
        pad = attention_mask.to(torch.bool)
        if pad.shape[-1] < kv:
            pad = nn.functional.pad(pad, (0, kv - pad.shape[-1]))
        pad = pad[:, :kv]
    if (q_len == 1 or kv == q_len) and (pad is None or bool(pad.all())):
        return None
    if past == 0 and (pad is None or (bool(pad[:, :q_len].all())
                                      and not bool(pad[:, q_len:].any()))):
        return None
    device = attention_mask.device if attention_mask is not None else None
    q_idx = torch.arange(q_len, device=device) + past
    causal = torch.arange(kv, device=device)[None, None, None, :] <= q_idx[None, None, :, None]
    mask = causal if pad is None else causal & pad[:, None, None, :]
    return mask.expand(batch, -1, q_len, kv)


class LeanLlama(nn.Module):
    """transformers' ``LlamaForCausalLM`` forward (see the module docstring), same names."""

    lean = True

    def __init__(self, cfg: dict, generation: dict | None = None):
        super().__init__()
        cfg = dict(cfg)
        cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
        cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        if not isinstance(cfg["head_dim"], int):
            cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
        self.config = c = LeanConfig(**cfg)
        self.config._attn_implementation = "lean"
        gen = dict(generation or {})
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            gen.setdefault(key, cfg.get(key))
        self.generation_config = SimpleNamespace(**gen)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(      # no initialisation: loading fills it
            c.vocab_size, c.hidden_size, _weight=torch.empty(c.vocab_size, c.hidden_size,
                                                             device="meta"))
        self.model.layers = nn.ModuleList(_Layer(c, i) for i in range(c.num_hidden_layers))
        self.model.norm = _Norm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = _linear(c.hidden_size, c.vocab_size)
        if tied_embeddings(cfg):
            self.lm_head.weight = self.model.embed_tokens.weight
        d = c.head_dim                                   # transformers' default rotary frequencies
        inv_freq = 1.0 / (_rope_theta(cfg) ** (torch.arange(0, d, 2, dtype=torch.float) / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def get_output_embeddings(self):
        return self.lm_head

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values=None,
                use_cache: bool = True, logits_to_keep: int = 0, **kwargs):
        if kwargs:
            raise TypeError(f"LeanLlama.forward takes no {', '.join(kwargs)}")
        cache = past_key_values
        if use_cache and cache is None:
            cache = LeanCache()
        past = cache.get_seq_length() if cache is not None else 0
        batch, q_len = input_ids.shape
        x = self.model.embed_tokens(input_ids)
        if position_ids is None:
            position_ids = (torch.arange(q_len, device=x.device) + past)[None]
        inv_freq = self.inv_freq.to(device=x.device, dtype=torch.float)
        freqs = position_ids[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * 1.0).to(x.dtype)[:, None]     # attention scaling 1.0, as transformers
        sin = (emb.sin() * 1.0).to(x.dtype)[:, None]
        mask = _causal_mask(attention_mask, past, q_len, batch)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, cache)
        x = self.model.norm(x)
        logits = self.lm_head(x[:, slice(-logits_to_keep, None), :])
        return SimpleNamespace(logits=logits, past_key_values=cache)


def load_lean(folder: str | Path, dtype: torch.dtype = torch.float32, tokenizer=None):
    """(LeanLlama, LeanTokenizer) of a checkpoint folder that ``lean_reason`` accepts, weights
    read tensor by tensor and cast to ``dtype`` as transformers' loader does (``tokenizer``:
    its tokenizer.json already parsed, if it was)."""
    folder = Path(folder)
    cfg = read_config_file(folder)
    gen_path = folder / "generation_config.json"
    generation = json.loads(gen_path.read_text(encoding="utf-8")) if gen_path.is_file() else None
    model = LeanLlama(cfg, generation)                  # on the meta device
    reader = CheckpointReader(folder)
    state = {}
    for name, _ in model.named_parameters():       # a tied head is the embedding: named once
        if name not in reader:
            raise ValueError(f"{folder}: the checkpoint lacks {name}")
        state[name] = reader.get(name).to(dtype)
    model.load_state_dict(state, strict=False, assign=True)
    if model.lm_head.weight.is_meta:                     # tied: assign replaced the embedding
        model.lm_head.weight = model.model.embed_tokens.weight
    model.eval()
    return model, LeanTokenizer(folder, tokenizer)


def load_lean_model(ref, device: str | None = "cpu"):
    """(LeanLlama, LeanTokenizer) for a model reference where ``lean_reason`` finds nothing
    against it (float32 on the CPU), else None: the caller loads it through transformers."""
    path = resolve(ref)
    reason, parsed = _checked(path, pick_device(device))
    return None if reason is not None else load_lean(path, tokenizer=parsed)
