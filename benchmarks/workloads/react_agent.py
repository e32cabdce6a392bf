"""ReAct agent (HotpotQA-agent shaped): 32 agents x 5 steps after a shared ~800-token
instruction with worked examples. Each step picks a tool with `select` and fills its argument
with a regex-constrained `gen`; the observation that follows is fixed text, so every system
sees the same prompts whatever the model picked.

plait: one program per agent (the select result decides the next regex, so each step waits
for the model). Outlines: per step, a choice generator over all agents, then one regex
generator per tool over the agents that picked it, each call re-encoding the whole history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import plait
from benchmarks.peers import Peers, Unavailable
from benchmarks.workloads.harness import (
    HF,
    NO_JUMP,
    NO_RADIX,
    OUTLINES,
    PLAIT,
    Clock,
    PlaitTarget,
    Run,
    Scale,
    Workload,
    peer_run,
    run_batch,
    timed_run,
)
from benchmarks.workloads.text import TextMaker

TOOLS = {
    "Search": r"[A-Z][a-z]{2,9}( [A-Z][a-z]{2,9}){0,2}",
    "Lookup": r"[a-z]{3,12}",
    "Calculate": r"[0-9]{1,4} [-+*/] [0-9]{1,4}",
    "Compare": r"[A-Z][a-z]{2,9} vs [A-Z][a-z]{2,9}",
}
ARG_TOKENS = 16


@dataclass(frozen=True)
class Size:
    agents: int
    steps: int = 5
    instruction_tokens: int = 800
    question_tokens: tuple[int, int] = (30, 60)
    observation_tokens: tuple[int, int] = (40, 80)


def size(scale: Scale) -> Size:
    smoke = Size(2, steps=2, instruction_tokens=100)
    return {"full": Size(32), "quick": Size(4, 2, 300), "smoke": smoke}[scale]


@dataclass(frozen=True)
class Agent:
    question: str
    observations: tuple[str, ...]


@dataclass(frozen=True)
class Data:
    instruction: str
    agents: tuple[Agent, ...]


def build(scale: Scale, maker: TextMaker) -> Data:
    sz = size(scale)
    tools = ", ".join(TOOLS)
    head = f"Solve the question with interleaved actions and observations. Tools: {tools}.\n"
    instruction = head + maker.passage(sz.instruction_tokens - maker.count(head)) + "\n\n"
    agents = tuple(
        Agent(
            maker.passage(maker.between(*sz.question_tokens)),
            tuple(maker.passage(maker.between(*sz.observation_tokens)) for _ in range(sz.steps)),
        )
        for _ in range(sz.agents)
    )
    return Data(instruction, agents)


@plait.program
def agent(s: Any, instruction: str, question: str, observations: list[str], index: int,
          clock: Clock) -> None:  # fmt: skip
    s += instruction + "Question:" + question + "\n"
    for k, observation in enumerate(observations):
        s += f"Action {k + 1}: " + plait.select(f"tool{k}", list(TOOLS))
        s += "[" + plait.gen(f"arg{k}", regex=TOOLS[s[f"tool{k}"]], max_tokens=ARG_TOKENS)
        s += f"]\nObservation {k + 1}:{observation}\n"
    _ = s[f"arg{len(observations) - 1}"]
    clock.mark(index)


def run_plait(data: Data, target: PlaitTarget) -> Run:
    def items(clock: Clock) -> list[dict[str, Any]]:
        return [
            {"instruction": data.instruction, "question": a.question,
             "observations": list(a.observations), "index": i, "clock": clock}
            for i, a in enumerate(data.agents)
        ]  # fmt: skip

    timed = run_batch(target, agent, items)
    steps = len(data.agents[0].observations)
    outputs = [tuple((st[f"tool{k}"], st[f"arg{k}"]) for k in range(steps)) for st in timed.states]
    tokens = sum(target.count(arg) for out in outputs for _, arg in out)
    return timed_run(timed, tokens, outputs)


def outlines_step(peers: Peers, histories: list[str], k: int) -> list[tuple[str, str]]:
    """One ReAct step for every agent: choose a tool, then its regex argument."""
    outlines = peers.outlines
    prompts = [h + f"Action {k + 1}: " for h in histories]
    tools = outlines.choice(prompts, list(TOOLS))
    args = [""] * len(prompts)
    for tool, pattern in TOOLS.items():
        rows = [i for i, t in enumerate(tools) if t == tool]
        if rows:
            got = outlines.regex([prompts[i] + tool + "[" for i in rows], pattern, ARG_TOKENS)
            for i, arg in zip(rows, got, strict=True):
                args[i] = arg
    return list(zip(tools, args, strict=True))


def run_outlines(data: Data, peers: Peers) -> Run:
    outlines = peers.outlines
    outlines.warm("choice", list(TOOLS))
    for pattern in TOOLS.values():
        outlines.warm("regex", pattern)
    peers.hf.work.clear()
    clock = Clock()
    histories = [data.instruction + "Question:" + a.question + "\n" for a in data.agents]
    outputs: list[list[tuple[str, str]]] = [[] for _ in data.agents]
    for k in range(len(data.agents[0].observations)):
        for i, (tool, arg) in enumerate(outlines_step(peers, histories, k)):
            observation = data.agents[i].observations[k]
            histories[i] += f"Action {k + 1}: {tool}[{arg}]\nObservation {k + 1}:{observation}\n"
            outputs[i].append((tool, arg))
    clock.mark(*range(len(data.agents)))
    tokens = sum(peers.hf.count(arg) for out in outputs for _, arg in out)
    return peer_run(clock, tokens, [tuple(o) for o in outputs])


def run_hf(data: Data, peers: Peers) -> Run:
    raise Unavailable("transformers generate has no regex constraint (Outlines row)")


WORKLOAD = Workload(
    name="react_agent",
    title="ReAct agent (32 agents x 5 steps of select + regex argument)",
    build=build,
    plait=run_plait,
    items=("agents",),
    sample=8,
    peers={OUTLINES: run_outlines, HF: run_hf},
    systems=(PLAIT, NO_RADIX, NO_JUMP),
)
