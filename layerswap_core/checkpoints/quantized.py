"""Quantized checkpoints: recognised from their metadata and refused, never merged as weights.

Real mixture-of-experts checkpoints are often stored quantized: gpt-oss in MXFP4 (each expert
matrix as ``*_blocks``, uint8 pairs of 4-bit values, and ``*_scales``, uint8 exponents per block
of 32), DeepSeek-V3 in FP8 blocks (``weight`` in float8 e4m3 with a ``weight_scale_inv`` per
128 x 128 block), others through bitsandbytes, GPTQ, AWQ, compressed-tensors... A blend,
a swap of some tensors or a delta of such blocks is not the blend, swap or delta of the
weights they encode (a mean of two exponents is not a mean of two scales), and the layer and
kind rules do not see the ``_blocks``/``_scales`` names as the matrices they are. layerswap does
not dequantize; ``quantization`` says what a checkpoint is, from its config.json's
``quantization_config`` and its tensors' names and dtypes (headers only), and the one
compatibility check (``compatibility.problems``: pre-flight, ``layerswap check``, the merge, the
live engine, the analysis) refuses it in one line with what to do.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

# names of the tensors a quantization scheme adds beside (or instead of) a weight: packed
# integers (MXFP4's blocks and exponents, GPTQ/AWQ's packed weights, bitsandbytes' states) and
# float scales (FP8's inverse block scales, GPTQ/AWQ's group scales)
_PACKED_NAMES = re.compile(r"(?:_blocks|_scales|\.qweight|\.qzeros|\.g_idx|\.quant_map|"
                           r"\.quant_state\.[\w.]+|\.SCB|\.weight_packed|\.weight_shape|"
                           r"\.weight_zero_point)$")
_SCALE_NAMES = re.compile(r"\.(?:weight_scale_inv|weight_scale|input_scale|scales|absmax)$")
# dtypes no weight of a float checkpoint is stored in
_QUANTIZED_DTYPES = {"F8_E4M3": "FP8 (e4m3)", "F8_E5M2": "FP8 (e5m2)"}
_INTEGER_DTYPES = ("U8", "I8", "I32")

# what each quant_method is, as the refusal says it
_METHODS = {"mxfp4": "MXFP4 (4-bit blocks with shared exponents, as gpt-oss ships)",
            "fp8": "FP8 blocks with per-block scales (as DeepSeek-V3 ships)",
            "bitsandbytes": "bitsandbytes", "gptq": "GPTQ", "awq": "AWQ",
            "compressed-tensors": "compressed-tensors", "fbgemm_fp8": "FP8 (fbgemm)"}
# transformers' own dequantizing load of each scheme it can dequantize
_DEQUANTIZE = {"mxfp4": "Mxfp4Config(dequantize=True)",
               "fp8": "FineGrainedFP8Config(dequantize=True)"}


def _method(config: dict) -> str | None:
    """The quant_method of a config.json (top level or its text_config), or None."""
    for cfg in (config, config.get("text_config")):
        q = cfg.get("quantization_config") if isinstance(cfg, dict) else None
        if isinstance(q, dict):
            m = q.get("quant_method") or ("bitsandbytes" if q.get("load_in_4bit") or
                                          q.get("load_in_8bit") else "unknown")
            return str(m)
        if q:
            return "unknown"
    return None


def quantization(config: dict, dtypes: Iterable[tuple[str, str]]) -> str | None:
    """What a checkpoint's quantization is ("quantized as X (...)": naming it and an example
    tensor), or None for a checkpoint of plain weights. ``dtypes``: its (tensor name, safetensors
    dtype) pairs."""
    method = _method(config)
    example = kind = None
    for name, dtype in dtypes:
        if dtype in _QUANTIZED_DTYPES:   # the weights themselves: said before their scales
            example, kind = name, _QUANTIZED_DTYPES[dtype]
            break
        if example is None and ((_PACKED_NAMES.search(name) and dtype in _INTEGER_DTYPES)
                                or _SCALE_NAMES.search(name)):
            example = name
            kind = ("MXFP4-style blocks and scales" if name.endswith(("_blocks", "_scales"))
                    else "FP8 blocks with scales" if name.endswith("_scale_inv")
                    else "packed integers with scales (GPTQ/AWQ style)")
    if method is None and example is None:
        return None
    said = (_METHODS.get(method, f"quant_method {method!r}") if method else kind)
    where = f"quantization_config quant_method {method!r}" if method else "no quantization_config"
    tensor = f", e.g. tensor {example}" if example else ""
    return f"quantized as {said} ({where}{tensor})"


def quantization_problem(role_reasons: dict[str, str]) -> str | None:
    """The one-line refusal of the quantized models ``{role: quantization(...)}`` (None if
    none): roles with the same quantization said together."""
    if not role_reasons:
        return None
    by_reason: dict[str, list[str]] = {}
    for role, reason in role_reasons.items():
        by_reason.setdefault(reason, []).append(role)
    parts = [f"{', '.join(roles)} {'is' if len(roles) == 1 else 'are'} {reason}"
             for reason, roles in by_reason.items()]
    return ("quantized checkpoint: " + "; ".join(parts) + ": layerswap merges weights, not "
            "quantized blocks (a blend or swap of blocks and scales is not one of the weights "
            "they encode); " + what_to_do(role_reasons.values()))


def what_to_do(reasons) -> str:
    """Use a dequantized copy; how, where transformers can make one."""
    how = sorted({c for m, c in _DEQUANTIZE.items() for r in reasons
                  if f"quant_method {m!r}" in r or (m == "mxfp4" and "MXFP4" in r)
                  or (m == "fp8" and "FP8" in r)})
    return ("use a dequantized bf16 copy of each model" + (
        f" (load it with AutoModelForCausalLM.from_pretrained(..., quantization_config="
        f"{' or '.join(how)}, dtype=torch.bfloat16) and save_pretrained it)" if how else ""))
