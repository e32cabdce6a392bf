"""The model: its config (config.py), the layers every family shares (layers.py), the batch a
forward reads (forward_batch.py), weight-only quantized layers (quantized.py), the fused CPU decode
step (fused_decode.py), the loaders of Hugging Face safetensors and GGUF files (loader.py,
gguf_loader.py), the built-in models (builtin.py, assets/) and the runner that owns the device,
the weights and the KV pool (runner.py)."""
