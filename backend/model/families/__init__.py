"""The model families, one module each: how a family's Hugging Face config.json and GGUF
metadata become a `ModelConfig` and how its tensor names map onto plait's parameters (the
`Family` of family.py). `common.py` reads what every family shares; the registry
(model/registry.py) lists them all."""
