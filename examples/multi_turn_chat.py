"""A three-turn chat through the model's chat template.

python examples/multi_turn_chat.py
"""

from __future__ import annotations

import plait

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


def main() -> plait.ProgramState:
    state = chat.run(questions=QUESTIONS, temperature=0.7, seed=1)
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content']!r}")
    usage = [state.meta(f"answer_{i}")["usage"] for i in range(len(QUESTIONS))]
    print("cached prompt tokens per turn:", [u["cached_tokens"] for u in usage])
    return state


if __name__ == "__main__":
    main()
