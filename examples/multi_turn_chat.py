"""A three-turn chat on SmolLM2-135M-Instruct: each turn renders the conversation through the
model's chat template, and reuses the previous turns' KV cache.

python examples/multi_turn_chat.py
"""

from __future__ import annotations

import contextlib
import os

import plait

MODEL = os.environ.get("PLAIT_MODEL", "smollm2-135m")  # or gemma3-270m, a path, ...
QUESTIONS = [
    "What is the capital of France?",
    "How many people live there?",
    "Name one museum in that city.",
]


@plait.program
def chat(s: plait.ProgramState, questions: list[str]) -> None:
    s += plait.system("You are a concise travel guide.")
    for i, question in enumerate(questions):
        s += plait.user(question)
        s += plait.assistant(plait.gen(f"answer_{i}", max_tokens=32))


def main(backend: plait.Backend | None = None) -> plait.ProgramState:
    with contextlib.ExitStack() as stack:
        if backend is None:
            backend = stack.enter_context(plait.LocalBackend(MODEL))
        state = chat.run(questions=QUESTIONS, backend=backend, temperature=0)
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content']}")
    usage = [state.meta(f"answer_{i}")["usage"] for i in range(len(QUESTIONS))]
    print("cached prompt tokens per turn:", [u["cached_tokens"] for u in usage])
    return state


if __name__ == "__main__":
    main()
