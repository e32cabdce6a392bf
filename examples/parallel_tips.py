"""Fork/join: expand several tips in parallel branches that share the prompt's KV cache.

python examples/parallel_tips.py
"""

from __future__ import annotations

import plait

TOPICS = ["sleep", "exercise", "diet"]


@plait.program
def tips(s: plait.ProgramState, topics: list[str]) -> None:
    s += "Here are some tips for staying healthy.\n"
    forks = s.fork(len(topics))
    forks += lambda i: f"Tip about {topics[i]}: " + plait.gen("tip", max_tokens=24, min_tokens=8)
    forks.join()
    for i, topic in enumerate(topics):
        s += f"{i + 1}. {topic}: {forks[i]['tip'].strip()}\n"
    s += "In summary, " + plait.gen("summary", max_tokens=24, min_tokens=8)


def main() -> plait.ProgramState:
    state = tips.run(topics=TOPICS, temperature=0.8, seed=3)
    print(state.text())
    print("branch tips gathered in the parent:", state["tip"])
    return state


if __name__ == "__main__":
    main()
