"""Extract structured records from 50 documents into a pydantic model, as one batch.

python examples/json_extraction.py
"""

from __future__ import annotations

from pydantic import BaseModel, Field

import plait


class Person(BaseModel):
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=130)
    city: str = Field(max_length=40)


NAMES = [
    "Ada",
    "Alan",
    "Grace",
    "Edsger",
    "Barbara",
    "Donald",
    "Frances",
    "John",
    "Leslie",
    "Niklaus",
]
CITIES = ["London", "Paris", "Zurich", "Boston", "Austin"]
DOCS = [f"{NAMES[i % 10]} is {20 + i} years old and lives in {CITIES[i % 5]}." for i in range(50)]


@plait.program
def extract(s: plait.ProgramState, doc: str) -> None:
    s += plait.system("Extract the person described in the text as JSON.")
    s += plait.user(doc)
    s += plait.assistant(plait.gen("person", json_schema=Person, max_tokens=128))


def main() -> list[plait.ProgramState]:
    states = extract.run_batch([{"doc": d} for d in DOCS], progress_bar=True, temperature=0.7)
    for state in states[:5]:
        print(repr(state["person"]))
    assert all(isinstance(state["person"], Person) for state in states)
    print(f"{len(states)} documents -> {len(states)} Person records")
    return states


if __name__ == "__main__":
    main()
