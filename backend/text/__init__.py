"""Text around token ids: a checkpoint's tokenizer and the decode helper (tokenizer.py),
incremental UTF-8-safe detokenization (detokenizer.py), and reasoning sections in an output
(reasoning.py). Nothing here imports the model."""
