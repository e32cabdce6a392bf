"""A ReAct agent: the model picks a tool with `select`, fills its argument with a
regex-constrained `gen`, and the tool (a Python function) answers.

    python examples/agent_react.py
"""

from __future__ import annotations

from collections.abc import Callable

import plait


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
def react(s: plait.ProgramState, question: str, max_steps: int = 5) -> None:
    s += plait.system("Answer by using the tools calculator and lookup. Say finish when done.")
    s += plait.user(question)
    for step in range(max_steps):
        s += f"Step {step + 1}. Action: " + plait.select(f"action_{step}", [*TOOLS, "finish"])
        action = s[f"action_{step}"]  # the body waits here for the model's choice
        if action == "finish":
            break
        tool, pattern = TOOLS[action]
        s += "\nInput: " + plait.gen(f"input_{step}", regex=pattern, max_tokens=16)
        s += f"\nObservation: {tool(s[f'input_{step}'])}\n"
    s += "\nFinal answer: " + plait.gen("answer", max_tokens=24, stop="\n")


def main() -> plait.ProgramState:
    state = react.run(
        question="What is 12 * 7, and how many people live in Paris?", temperature=0.7
    )
    print(state.text())
    return state


if __name__ == "__main__":
    main()
