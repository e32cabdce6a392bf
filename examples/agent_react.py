"""A ReAct agent on SmolLM2-135M-Instruct: the model picks a tool with `select`, fills its
argument with a regex-constrained `gen`, the tool (a Python function) answers, and the model
writes the answer from the observation.

    python examples/agent_react.py

The program keeps a 135M model on track: two worked examples in the system prompt, each
tool offered at most once, and the tool's input held to its regex.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import plait

MODEL = os.environ.get("PLAIT_MODEL", "smollm2-135m")  # or gemma3-270m, a path, ...
QUESTIONS = ["What is 12 * 7?", "How many people live in Tokyo?"]
SYSTEM = """You answer questions with two tools: calculator computes arithmetic such as 3 * 4, \
lookup gives the population of a city. Use a tool, read its observation, then finish with the \
answer.

Question: What is 3 * 4?
Action: calculator
Input: 3 * 4
Observation: 12
Action: finish
Answer: 12

Question: How many people live in Rome?
Action: lookup
Input: Rome
Observation: 2.8 million
Action: finish
Answer: 2.8 million"""


def calculator(expression: str) -> str:
    a, op, b = expression.split()
    ops: dict[str, Callable[[int, int], int]] = {
        "+": lambda x, y: x + y,
        "-": lambda x, y: x - y,
        "*": lambda x, y: x * y,
    }
    return str(ops[op](int(a), int(b)))


def lookup(city: str) -> str:
    populations = {"Paris": "2.1 million", "London": "8.9 million", "Tokyo": "14 million"}
    return populations.get(city, "unknown")


TOOLS: dict[str, tuple[Callable[[str], str], str]] = {
    "calculator": (calculator, r"[0-9]{1,4} [+*-] [0-9]{1,4}"),
    "lookup": (lookup, r"(Paris|London|Tokyo)"),
}


@plait.program
def react(s: plait.ProgramState, question: str, max_steps: int = 3) -> None:
    s += plait.system(SYSTEM)
    s += plait.user(question)
    with s.assistant():
        unused = list(TOOLS)
        for step in range(max_steps):
            choices = [*unused, "finish"]
            s += "Action: " + plait.select(f"action_{step}", choices, method="greedy_token")
            action = s[f"action_{step}"]  # the body waits here for the model's choice
            if action == "finish":
                break
            unused.remove(action)
            tool, pattern = TOOLS[action]
            s += "\nInput: " + plait.gen(f"input_{step}", regex=pattern, max_tokens=16)
            s += f"\nObservation: {tool(s[f'input_{step}'])}\n"
        s += "\nAnswer: " + plait.gen("answer", max_tokens=24, stop="\n")


def main(
    backend: plait.Backend | None = None, questions: list[str] = QUESTIONS
) -> list[plait.ProgramState]:
    with contextlib.ExitStack() as stack:
        if backend is None:
            backend = stack.enter_context(plait.LocalBackend(MODEL))
        args = [{"question": q} for q in questions]
        states = react.run_batch(args, backend=backend, temperature=0)
    for question, state in zip(questions, states, strict=True):
        print(f"Question: {question}\n{state.messages()[-1]['content']}\n")
    return states


if __name__ == "__main__":
    main()
