"""Load a Llama-family checkpoint and its tokenizer: a Hugging Face directory (config.json +
*.safetensors, sharded or not) or a GGUF file (plait.backend.gguf)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from plait.backend.config import QUANTIZATIONS
from plait.backend.gguf import is_gguf, load_gguf_model, load_gguf_tokenizer
from plait.backend.model import LlamaForCausalLM, empty_model
from plait.backend.model_config import ModelConfig
from plait.backend.quantized import quantize_model

# HF name fragment -> (plait parameter fragment, shard index within the merged weight)
_MERGED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def load_model(
    path: str | Path,
    *,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str = "auto",
) -> LlamaForCausalLM:
    """Build the model from `path`: its safetensors files or the GGUF file `path`.

    `quantization`: "auto" keeps a GGUF file's quantized weights packed and loads float
    checkpoints as they are; "none" de-quantizes everything to `dtype`; "int8"/"int4" also
    quantize the float linear layers (and a tied embedding) at load."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    model = _load(path, dtype=dtype, device=device, keep_quantized=quantization != "none")
    if quantization in ("int8", "int4"):
        quantize_model(model, bits=8 if quantization == "int8" else 4)
    return model


def _load(
    path: str | Path, *, dtype: torch.dtype, device: torch.device, keep_quantized: bool
) -> LlamaForCausalLM:
    if is_gguf(path):
        return load_gguf_model(path, dtype=dtype, device=device, keep_quantized=keep_quantized)
    path = Path(path)
    cfg = ModelConfig.from_dir(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    model = empty_model(cfg, dtype=dtype, device=device)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has keys(), not __iter__
                target = _assign(cfg, params, name, f.get_tensor(name))
                if target:
                    loaded.add(target)
    missing = {n for n in _expected_keys(params) if n not in loaded}
    if cfg.tie_word_embeddings:
        missing.discard("lm_head.weight")
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights for {sorted(missing)[:5]}")
    return model.eval()


def _assign(
    cfg: ModelConfig, params: dict[str, torch.nn.Parameter], name: str, tensor: torch.Tensor
) -> str | None:
    """Copy one checkpoint tensor into its (possibly merged) parameter; returns its name."""
    if "rotary_emb" in name:
        return None
    name = name.removeprefix("model.")
    for hf, (ours, shard) in _MERGED.items():
        if f".{hf}." in name:
            target = name.replace(f".{hf}.", f".{ours}.")
            param = params[target]
            sizes = _shard_sizes(cfg, ours)
            start = sum(sizes[:shard])
            param.data[start : start + sizes[shard]].copy_(tensor)
            return f"{target}#{shard}"
    if name not in params:
        raise ValueError(f"unexpected weight {name!r} in checkpoint")
    params[name].data.copy_(tensor)
    return name


def _expected_keys(params: dict[str, torch.nn.Parameter]) -> list[str]:
    """Parameter names, merged ones once per shard as `_assign` reports them."""
    keys = []
    for name in params:
        shards = 3 if ".qkv_proj." in name else 2 if ".gate_up_proj." in name else 0
        keys.extend([f"{name}#{i}" for i in range(shards)] if shards else [name])
    return keys


def _shard_sizes(cfg: ModelConfig, merged: str) -> list[int]:
    if merged == "qkv_proj":
        return [cfg.q_size, cfg.kv_size, cfg.kv_size]
    return [cfg.intermediate_size, cfg.intermediate_size]


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The checkpoint's own tokenizer (fast tokenizer.json when present; a GGUF file's from
    its metadata)."""
    if is_gguf(path):
        return load_gguf_tokenizer(path)
    path = Path(path)
    if (path / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))
