"""The embedded default models, built deterministically into a cache directory on first use,
and the names of the real models installed as Python packages (packaged.py).

`plait-tiny` (tests, demo) and `plait-small` (benchmarks) are Llama-architecture models with
random weights (fixed seed) plus one deliberate structure: residual dimension 0 carries a
constant that the output layer turns into a unigram log-frequency prior over the vocabulary
(counted on the tokenizer's training corpus). So their text has the token statistics of real
text — frequent punctuation, a reasonable end-of-text rate — while the rest is noise. The
result is a normal Hugging Face model directory that `transformers` loads as well.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from plait.backend.model.packaged import PACKAGED, packaged_model_path

ASSETS = Path(__file__).with_name("assets")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
EOS_RATE = 1 / 48  # prior probability mass of end-of-text, about one per 48 tokens
PRIOR_DIM_SCALE = 4.0  # residual dim 0 = this * sqrt(hidden): dominates the final norm
LOGIT_NOISE_STD = 5.0  # std of the random part of the logits


@dataclass(frozen=True)
class BuiltinSpec:
    """Shape and seed of one embedded model."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_position_embeddings: int
    seed: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


BUILTINS = {
    "plait-tiny": BuiltinSpec("plait-tiny", 256, 768, 4, 4, 2, 4096, seed=1234),
    "plait-small": BuiltinSpec("plait-small", 512, 1536, 8, 8, 4, 8192, seed=4321),
}


def cache_root() -> Path:
    return Path(os.environ.get("PLAIT_CACHE_DIR", Path.home() / ".cache" / "plait"))


def resolve_model_path(model: str | os.PathLike[str] | None) -> Path:
    """A local model for `model`: a builtin name (built or located), a Hugging Face model
    directory, or a `.gguf` file."""
    name = str(model) if model is not None else "plait-tiny"
    if name in BUILTINS:
        return ensure_builtin(BUILTINS[name])
    if name in PACKAGED:
        return packaged_model_path(PACKAGED[name], cache=cache_root() / "packaged")
    path = Path(name).expanduser()
    if path.suffix.lower() == ".gguf" and path.is_file():
        return path
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"model {name!r} is neither a builtin {sorted(BUILTINS) + sorted(PACKAGED)}, "
            "a directory with config.json, nor a .gguf file"
        )
    return path


def ensure_builtin(spec: BuiltinSpec) -> Path:
    """Build `spec` into the cache once (atomically, safe across processes)."""
    target = cache_root() / f"{spec.name}-{_fingerprint(spec)}"
    if (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=target.parent))
    try:
        write_model_dir(spec, tmp)
        os.replace(tmp, target)
    except OSError:
        if not (target / "model.safetensors").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_model_dir(spec: BuiltinSpec, out: Path) -> None:
    """Write config, weights and tokenizer files of `spec` into `out`."""
    vocab = _vocab_size()
    (out / "config.json").write_text(json.dumps(_hf_config(spec, vocab), indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    save_file(make_weights(spec, vocab), str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(ASSETS / "tokenizer.json", out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(spec), indent=2))
    special = {"eos_token": SPECIAL_TOKENS[0], "pad_token": SPECIAL_TOKENS[0]}
    (out / "special_tokens_map.json").write_text(json.dumps(special))


def make_weights(spec: BuiltinSpec, vocab: int) -> dict[str, torch.Tensor]:
    """Deterministic weights in Hugging Face Llama naming."""
    d, inter, kv = spec.hidden_size, spec.intermediate_size, spec.num_kv_heads * spec.head_dim
    gen = torch.Generator().manual_seed(spec.seed)

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) * std

    prior_dim = PRIOR_DIM_SCALE * math.sqrt(d)
    embed = normal(vocab, d, 1.0)
    embed[:, 0] = prior_dim
    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": embed}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = normal(d, d, d**-0.5)
        w[p + "self_attn.k_proj.weight"] = normal(kv, d, d**-0.5)
        w[p + "self_attn.v_proj.weight"] = normal(kv, d, d**-0.5)
        w[p + "self_attn.o_proj.weight"] = normal(d, d, d**-0.5)
        w[p + "mlp.gate_proj.weight"] = normal(inter, d, d**-0.5)
        w[p + "mlp.up_proj.weight"] = normal(inter, d, d**-0.5)
        w[p + "mlp.down_proj.weight"] = normal(d, inter, inter**-0.5)
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            w[p + name][0] = 0.0  # layers never write the prior dimension
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            w[p + name] = torch.ones(d)
            w[p + name][0] = 0.0  # ... nor read it
    w["model.norm.weight"] = torch.ones(d)
    lm_head = normal(vocab, d, LOGIT_NOISE_STD / math.sqrt(d))
    lm_head[:, 0] = unigram_prior(vocab) / math.sqrt(d)
    w["lm_head.weight"] = lm_head
    return {k: v.contiguous() for k, v in w.items()}


def unigram_prior(vocab: int) -> torch.Tensor:
    """Centered log-frequencies of each token (add-one smoothed; EOS tokens at EOS_RATE)."""
    counts = torch.tensor(
        json.loads((ASSETS / "token_counts.json").read_text()), dtype=torch.float64
    )
    counts = torch.cat([counts, torch.zeros(vocab - counts.numel(), dtype=torch.float64)]) + 1
    counts[[0, 2]] = counts.sum() * EOS_RATE
    logp = torch.log(counts / counts.sum())
    return (logp - logp.mean()).float()


def _vocab_size() -> int:
    tok = json.loads((ASSETS / "tokenizer.json").read_text())
    return len(tok["model"]["vocab"]) + sum(
        1 for t in tok["added_tokens"] if t["content"] not in tok["model"]["vocab"]
    )


def _fingerprint(spec: BuiltinSpec) -> str:
    h = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode())
    h.update(Path(__file__).read_bytes())
    for name in ("tokenizer.json", "token_counts.json"):
        h.update((ASSETS / name).read_bytes())
    return h.hexdigest()[:10]


def _hf_config(spec: BuiltinSpec, vocab: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "torch_dtype": "float32",
    }


def _tokenizer_config(spec: BuiltinSpec) -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": spec.max_position_embeddings,
        "bos_token": None,
        "eos_token": SPECIAL_TOKENS[0],
        "pad_token": SPECIAL_TOKENS[0],
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
