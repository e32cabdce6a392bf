"""Structured-output accuracy on the real model (SmolLM2-135M-Instruct): a subset of the
labeled extraction set (`tests/data/extraction`), greedy, the `spaced` JSON layout (the
best measured; the default is still `compact`: docs/structured.md).

The full measurement, with the other layouts and the peers, is
`python -m benchmarks.extraction_accuracy` (docs/structured.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from plait.backend.engine.engine import Engine

sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.extraction_accuracy import MAX_TOKENS, Prompts  # noqa: E402
from benchmarks.extraction_scoring import Score, is_valid, load_documents  # noqa: E402

pytestmark = pytest.mark.real_model

# Measured on this subset (the first two documents of each task, 40 fields): 10/10 valid,
# 31/40 fields right (2026-12-03). The floor leaves five fields of slack for numerical
# differences between machines (greedy near-ties).
FIELD_FLOOR = 0.65
EXPECTED = {  # (task, index) -> the exact answer measured, and right by the label
    ("person", 0): {"name": "Maria Lopez", "age": 34, "city": "Barcelona"},
    ("review", 1): {"product": "coffee maker", "rating": 1, "sentiment": "negative"},
}


def test_spaced_layout_is_valid_and_accurate_on_the_real_model(smollm2_engine: Engine) -> None:
    docs = [d for d in load_documents() if d.index < 2]
    prompts = Prompts()
    params = [
        {"temperature": 0.0, "max_new_tokens": MAX_TOKENS, "json_schema": d.schema,
         "json_layout": "spaced"}
        for d in docs
    ]  # fmt: skip
    outs = smollm2_engine.generate(input_ids=[prompts.ids(d) for d in docs], sampling_params=params)
    score = Score()
    answers = {}
    for doc, out in zip(docs, outs, strict=True):
        value = json.loads(out["text"])
        answers[doc.task, doc.index] = value
        score.add(doc, value, valid=is_valid(doc.schema, value))
    print(score.as_dict(), answers)
    assert score.valid == score.docs
    assert score.right / score.fields >= FIELD_FLOOR
    for key, expected in EXPECTED.items():
        assert answers[key] == expected
