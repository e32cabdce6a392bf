"""Multi-turn chat (SGLang's multi-turn benchmark shape): 32 conversations x 4 turns, each
user turn 256-512 tokens, 64 generated tokens per reply, under a short shared system prompt.

plait: one program per conversation with `plait.user`/`plait.assistant` roles (ChatML via the
model's template); each turn reuses the cached history. transformers: conversations in batches
of 16, each turn re-encodes the whole history with `apply_chat_template` and calls `generate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import plait
from benchmarks.peers import Peers
from benchmarks.workloads.harness import (
    HF,
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


@dataclass(frozen=True)
class Size:
    conversations: int
    turns: int = 4
    user_tokens: tuple[int, int] = (256, 512)
    new_tokens: int = 64
    system_tokens: int = 48


def size(scale: Scale) -> Size:
    full, quick = Size(32), Size(4, 2, (64, 128), new_tokens=16)
    return {"full": full, "quick": quick, "smoke": Size(2, turns=2, user_tokens=(16, 32))}[scale]


@dataclass(frozen=True)
class Data:
    system: str
    conversations: tuple[tuple[str, ...], ...]
    new_tokens: int


def build(scale: Scale, maker: TextMaker) -> Data:
    sz = size(scale)
    system = "You are a helpful assistant." + maker.passage(sz.system_tokens)
    conversations = tuple(
        tuple(maker.passage(maker.between(*sz.user_tokens)).lstrip() for _ in range(sz.turns))
        for _ in range(sz.conversations)
    )
    return Data(system, conversations, sz.new_tokens)


@plait.program
def chat(s: Any, system: str, turns: list[str], new_tokens: int, index: int, clock: Clock) -> None:
    s += plait.system(system)
    for t, message in enumerate(turns):
        s += plait.user(message)
        s += plait.assistant(plait.gen(f"reply{t}", max_tokens=new_tokens, min_tokens=new_tokens))
    _ = s[f"reply{len(turns) - 1}"]
    clock.mark(index)


def run_plait(data: Data, target: PlaitTarget) -> Run:
    def items(clock: Clock) -> list[dict[str, Any]]:
        return [
            {
                "system": data.system,
                "turns": list(turns),
                "new_tokens": data.new_tokens,
                "index": i,
                "clock": clock,
            }
            for i, turns in enumerate(data.conversations)
        ]

    timed = run_batch(target, chat, items)
    turns = len(data.conversations[0])
    outputs = [tuple(st[f"reply{t}"] for t in range(turns)) for st in timed.states]
    return timed_run(timed, len(outputs) * turns * data.new_tokens, outputs)


def hf_conversations(
    data: Data, peers: Peers, indices: range, clock: Clock
) -> list[tuple[str, ...]]:
    """One batch of conversations, turn by turn, the whole history re-encoded each turn."""
    hf = peers.hf
    histories = [[{"role": "system", "content": data.system}] for _ in indices]
    for t in range(len(data.conversations[0])):
        for history, i in zip(histories, indices, strict=True):
            history.append({"role": "user", "content": data.conversations[i][t]})
        prompts = [
            hf.tokenizer.apply_chat_template(h, tokenize=False, add_generation_prompt=True)
            for h in histories
        ]
        replies = hf.generate(prompts, [data.new_tokens] * len(prompts))
        for history, reply in zip(histories, replies, strict=True):
            history.append({"role": "assistant", "content": reply})
    clock.mark(*indices)
    return [tuple(m["content"] for m in h if m["role"] == "assistant") for h in histories]


def run_hf(data: Data, peers: Peers) -> Run:
    hf_conversations(data, peers, range(1), Clock())  # warm up
    peers.hf.work.clear()
    clock = Clock()
    outputs: list[tuple[str, ...]] = []
    n, size_ = len(data.conversations), peers.hf.batch_size
    for lo in range(0, n, size_):
        outputs += hf_conversations(data, peers, range(lo, min(lo + size_, n)), clock)
    turns = len(data.conversations[0])
    return peer_run(clock, len(outputs) * turns * data.new_tokens, outputs)


WORKLOAD = Workload(
    name="multi_turn_chat",
    title="Multi-turn chat (32 conversations x 4 turns, 64 new tokens per turn)",
    build=build,
    plait=run_plait,
    items=("conversations",),
    sample=16,
    peers={HF: run_hf},
)
