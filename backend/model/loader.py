"""Load a checkpoint: a Hugging Face directory (config.json + *.safetensors, sharded or not) or
a GGUF file (gguf_loader.py). The family comes from the registry; tensor names go to their
parameters through weights.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from plait.backend.config import QUANTIZATIONS
from plait.backend.gguf import is_gguf
from plait.backend.model.config import ModelConfig
from plait.backend.model.family import Family
from plait.backend.model.gguf_loader import load_gguf_model
from plait.backend.model.layers import CausalLM, empty_model
from plait.backend.model.quantized import quantize_model
from plait.backend.model.registry import family_named, hf_family
from plait.backend.model.rotary import rotary_rows
from plait.backend.model.weights import Target, check_complete, copy_into, hf_target


def load_model(
    path: str | Path,
    *,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str = "auto",
) -> CausalLM:
    """Build the model from `path`: its safetensors files or the GGUF file `path`.

    `quantization`: "auto" keeps a GGUF file's quantized weights packed and loads float
    checkpoints as they are; "none" de-quantizes everything to `dtype`; "int8"/"int4" also
    quantize the float linear layers (and a tied embedding) at load."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    keep = quantization != "none"
    if is_gguf(path):
        model = load_gguf_model(path, dtype=dtype, device=device, keep_quantized=keep)
    else:
        model = load_hf_model(Path(path), dtype=dtype, device=device)
    if quantization in ("int8", "int4"):
        quantize_model(model, bits=8 if quantization == "int8" else 4)
    return model


def hf_config_dict(path: Path) -> dict[str, Any]:
    """config.json, its eos ids joined by generation_config.json's (when present)."""
    cfg: dict[str, Any] = json.loads((path / "config.json").read_text())
    gen_path = path / "generation_config.json"
    if gen_path.exists():
        gen_eos = json.loads(gen_path.read_text()).get("eos_token_id")
        eos = [*_ids(cfg.get("eos_token_id")), *_ids(gen_eos)]
        cfg = {**cfg, "eos_token_id": list(dict.fromkeys(eos))}
    return cfg


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]


def hf_model_config(path: Path) -> ModelConfig:
    """The `ModelConfig` of a Hugging Face directory, read by its family."""
    cfg = hf_config_dict(path)
    arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
    return hf_family(arch).from_hf(cfg)


def load_hf_model(path: Path, *, dtype: torch.dtype, device: torch.device) -> CausalLM:
    """The model of a Hugging Face directory, every tensor of its safetensors files in place."""
    cfg = hf_model_config(path)
    family = family_named(cfg.family)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    model = empty_model(cfg, dtype=dtype, device=device)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has keys(), not __iter__
                target = hf_target(name, family.hf_renames)
                if target is not None:
                    value = _prepared(family, cfg, target, f.get_tensor(name))
                    copy_into(params, cfg, target, value, source=name)
                    loaded.update(target.keys)
    check_complete(params, cfg, loaded, f"checkpoint {path}")
    return model.eval()


def _prepared(
    family: Family, cfg: ModelConfig, target: Target, value: torch.Tensor
) -> torch.Tensor:
    """A checkpoint tensor as plait's parameter holds it: the family's norm offset added,
    q/k rows reordered for a partial rotation."""
    if family.norm_offset and target.param.endswith("norm.weight"):
        value = value.float() + family.norm_offset
    return rotary_rows(cfg, target, value)
