"""The labeled extraction set (`tests/data/extraction`) and how an answer is scored.

Each task `NAME` has `NAME.schema.json` and `NAME.jsonl` (one document a line: `instruction`,
`doc`, `expected`). An answer is *valid* when it parses and validates against the schema,
formats included; each expected top-level field is *right* when the answer's value equals it
(strings trimmed and case-insensitive, numbers as floats, booleans exactly, lists and objects
element by element; a field the label leaves out must be absent or null).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

DATA = Path(__file__).parents[1] / "tests" / "data" / "extraction"


@dataclass(frozen=True)
class Document:
    """One labeled document of a task."""

    task: str
    index: int
    prompt: str
    expected: dict[str, Any]
    schema: dict[str, Any]


@dataclass
class Score:
    """Valid answers and right fields over some documents."""

    docs: int = 0
    valid: int = 0
    fields: int = 0
    right: int = 0
    per_task: dict[str, list[int]] = field(default_factory=dict)

    def add(self, doc: Document, answer: Any, *, valid: bool) -> None:
        right = fields_right(doc.expected, answer)
        self.docs += 1
        self.valid += valid
        self.fields += len(doc.expected)
        self.right += right
        row = self.per_task.setdefault(doc.task, [0, 0, 0, 0])
        for i, n in enumerate((1, int(valid), len(doc.expected), right)):
            row[i] += n

    def as_dict(self) -> dict[str, Any]:
        names = ("docs", "valid", "fields", "right")
        tasks = {t: dict(zip(names, r, strict=True)) for t, r in self.per_task.items()}
        return {"docs": self.docs, "valid": self.valid, "fields": self.fields,
                "right": self.right, "per_task": tasks}  # fmt: skip


def load_documents(*, tasks: tuple[str, ...] | None = None, data: Path = DATA) -> list[Document]:
    """Every labeled document (of `tasks`, default all), task by task."""
    docs = []
    for path in sorted(data.glob("*.schema.json")):
        task = path.name.removesuffix(".schema.json")
        if tasks is not None and task not in tasks:
            continue
        schema = json.loads(path.read_text())
        for i, line in enumerate((data / f"{task}.jsonl").read_text().splitlines()):
            row = json.loads(line)
            prompt = f"{row['instruction']}\n\n{row['doc']}"
            docs.append(Document(task, i, prompt, row["expected"], schema))
    return docs


def parse_answer(text: str, *, first_object: bool) -> Any:
    """The answer's JSON value (`first_object`: the first JSON object anywhere in free text,
    as an unconstrained answer is read), or None."""
    decoder = json.JSONDecoder()
    starts = [i for i, c in enumerate(text) if c == "{"] if first_object else [0]
    for start in starts:
        try:
            return decoder.raw_decode(text.strip() if not first_object else text[start:])[0]
        except json.JSONDecodeError:
            continue
    return None


def is_valid(schema: dict[str, Any], value: Any) -> bool:
    """`value` validates against `schema`, formats checked."""
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    validator = jsonschema.Draft202012Validator(schema, format_checker=checker)
    return value is not None and validator.is_valid(value)


def fields_right(expected: dict[str, Any], answer: Any) -> int:
    """How many of the expected top-level fields the answer has right."""
    if not isinstance(answer, dict):
        return 0
    return sum(same(value, answer.get(key)) for key, value in expected.items())


def same(want: Any, got: Any) -> bool:
    """Equal as the scoring reads values (see the module docstring)."""
    if isinstance(want, bool) or want is None:
        return got is want
    if isinstance(want, (int, float)):
        ok = isinstance(got, (int, float)) and not isinstance(got, bool)
        return ok and math.isclose(float(want), float(got), rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(want, str):
        return isinstance(got, str) and want.strip().casefold() == got.strip().casefold()
    if isinstance(want, list):
        ok = isinstance(got, list) and len(got) == len(want)
        return ok and all(same(w, g) for w, g in zip(want, got, strict=True))
    if isinstance(want, dict):
        keys = set(want) | (set(got) if isinstance(got, dict) else set())
        return isinstance(got, dict) and all(same(want.get(k), got.get(k)) for k in keys)
    return False
