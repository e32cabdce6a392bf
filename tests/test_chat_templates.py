"""A program's role text is what transformers' `apply_chat_template` renders for the same
conversation, on the published chat templates of SmolLM2, Llama 3.1/3.2, Qwen2.5, Qwen3,
Mistral 7B v0.3 and Gemma 2/3 (tests/data/chat_templates; each file names its source).

A recording backend answers every gen with a scripted reply and keeps the text it was asked
to continue: at each assistant gen that text must be `apply_chat_template(history,
add_generation_prompt=True)`, and the finished program's text `apply_chat_template(messages)`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

import plait
from plait.chat_template import SPECIAL_TOKENS, ChatTemplate
from plait.clients.base import Backend, ChoiceLogprobs, GenOutput, OnText
from plait.tracing import leading_text

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
NAMES = sorted(p.stem for p in TEMPLATES.glob("*.json"))
Messages = list[dict[str, str]]


def load(name: str) -> tuple[PreTrainedTokenizerFast, ChatTemplate]:
    """transformers' tokenizer (a stand-in vocabulary: only the template and special tokens
    matter for rendering) and plait's template, from one tokenizer config."""
    config = json.loads((TEMPLATES / f"{name}.json").read_text())
    tokens = {k: config[k] for k in SPECIAL_TOKENS if k in config}
    vocab = {t: i for i, t in enumerate(["[unk]", *tokens.values()])}
    model = WordLevel(vocab, unk_token="[unk]")
    hf = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(model), chat_template=config["chat_template"], **tokens
    )
    return hf, ChatTemplate.from_jinja(config["chat_template"], **tokens)


class Recorder(Backend):
    """Answers gens with `replies` in turn; `prompts` are the texts it was asked to continue."""

    def __init__(self, template: ChatTemplate, replies: Sequence[str]) -> None:
        self._template = template
        self.replies = list(replies)
        self.prompts: list[str] = []

    @property
    def chat_template(self) -> ChatTemplate:
        return self._template

    async def generate(
        self, text: str, params: dict[str, Any], *, on_text: OnText | None = None
    ) -> GenOutput:
        self.prompts.append(text)
        return GenOutput(self.replies.pop(0), {"finish_reason": {"type": "stop"}})

    async def score(
        self, prefix: str, choices: Sequence[str], *, unconditional: bool = False
    ) -> list[ChoiceLogprobs]:
        raise NotImplementedError

    async def cache_prefix(self, text: str) -> dict[str, Any]:
        return {}


@plait.program
def conversation(s, turns: Messages, end_open: bool):  # type: ignore[no-untyped-def]
    """The given messages, each assistant turn generated; with `end_open`, one more
    assistant turn generated at the end."""
    for i, turn in enumerate(turns):
        if turn["role"] == "assistant":
            s += plait.assistant(plait.gen(f"a{i}"))
        else:
            role = plait.system if turn["role"] == "system" else plait.user
            s += role(turn["content"])
    if end_open:
        with s.assistant():
            s += plait.gen("last")


def run(name: str, turns: Messages, *, end_open: bool) -> tuple[Any, Recorder, Any]:
    hf, template = load(name)
    replies = [t["content"] for t in turns if t["role"] == "assistant"] + ["The end."]
    backend = Recorder(template, replies)
    state = conversation.run(turns=turns, end_open=end_open, backend=backend)
    return hf, backend, state


def expected_prompts(hf: Any, turns: Messages, end_open: bool) -> list[str]:
    """apply_chat_template(history, add_generation_prompt=True) before every assistant turn."""
    points = [i for i, t in enumerate(turns) if t["role"] == "assistant"]
    points += [len(turns)] if end_open else []
    return [
        hf.apply_chat_template(turns[:i], tokenize=False, add_generation_prompt=True)
        for i in points
    ]


USER_FIRST = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
]
MULTI_TURN = [
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "  Tell me a joke about cats.  "},  # trimmed by some templates
    {"role": "assistant", "content": " Why did the cat sit on the computer? "},
    {"role": "user", "content": "Another one."},
]
SYSTEM = [{"role": "system", "content": "You are terse."}]
NO_SYSTEM_ROLE = {"gemma-2-it"}  # its template raises 'System role not supported'
CONVERSATIONS = {
    "user first": USER_FIRST,
    "multi-turn": MULTI_TURN,
    "system + multi-turn": SYSTEM + MULTI_TURN,
    "system + one turn": SYSTEM + USER_FIRST,
}
CASES = [
    (name, label, end_open)
    for name in NAMES
    for label, turns in CONVERSATIONS.items()
    for end_open in (True, False)
    if not (name in NO_SYSTEM_ROLE and turns[0]["role"] == "system")
    if not (end_open and turns[-1]["role"] == "assistant")
]


@pytest.mark.parametrize(("name", "label", "end_open"), CASES)
def test_roles_render_like_apply_chat_template(name: str, label: str, end_open: bool) -> None:
    turns = CONVERSATIONS[label]
    hf, backend, state = run(name, turns, end_open=end_open)
    assert backend.prompts == expected_prompts(hf, turns, end_open)
    messages = [*turns, {"role": "assistant", "content": "The end."}][: len(turns) + end_open]
    assert state.messages() == messages
    assert state.text() == hf.apply_chat_template(messages, tokenize=False)


def test_the_templates_are_the_published_ones() -> None:
    """The texts every vendor's template is known by (a guard against a copy gone wrong)."""
    expected = {
        "smollm2-135m-instruct": "You are a helpful AI assistant named SmolLM",
        "llama-3.1-instruct": "Today Date: 26 Jul 2024",
        "qwen2.5-instruct": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
        "qwen3": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "deepseek-r1-distill-qwen": "<｜User｜>Hi<｜Assistant｜><think>\n",
        "mistral-7b-instruct-v0.3": "<s>[INST] Hi[/INST]",
        "gemma-2-it": "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
        "gemma-3-it": "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
        "llama-3.2-instruct": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>",
    }
    assert sorted(expected) == NAMES
    for name, text in expected.items():
        hf, _ = load(name)
        rendered = hf.apply_chat_template(
            [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
        )
        assert text in rendered, (name, rendered)


def test_default_system_prompt_and_headers_come_first() -> None:
    """What per-role prefixes lost: SmolLM2's and Qwen2.5's default system prompt, Llama's
    date header, Gemma 3's system prompt inside the first user turn, Mistral's in the last."""
    for name, first in [
        ("smollm2-135m-instruct", "<|im_start|>system\nYou are a helpful AI assistant"),
        ("qwen2.5-instruct", "<|im_start|>system\nYou are Qwen"),
        ("llama-3.1-instruct", "<|begin_of_text|><|start_header_id|>system<|end_header_id|>"),
    ]:
        _, backend, _ = run(name, USER_FIRST, end_open=False)
        assert backend.prompts[0].startswith(first), name
    _, backend, _ = run("gemma-3-it", SYSTEM + MULTI_TURN, end_open=True)
    assert backend.prompts[0].startswith("<bos><start_of_turn>user\nYou are terse.\n\nHi!")
    _, backend, _ = run("mistral-7b-instruct-v0.3", SYSTEM + MULTI_TURN, end_open=True)
    assert backend.prompts[0] == "<s>[INST] You are terse.\n\nHi![/INST]"
    assert backend.prompts[-1].endswith("[INST] You are terse.\n\nAnother one.[/INST]")
    assert "You are terse." not in backend.prompts[-1].split("[/INST]")[0]  # moved, not kept


def test_qwen3_think_blocks_like_the_template() -> None:
    """The last assistant turn keeps its think block; once a user turn follows, it is
    dropped from the history, as apply_chat_template drops it."""
    turns = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHello!"},
        {"role": "user", "content": "And?"},
    ]
    hf, backend, state = run("qwen3", turns, end_open=True)
    assert backend.prompts == expected_prompts(hf, turns, True)
    assert "<think>" not in backend.prompts[-1]
    done = hf.apply_chat_template(turns[:2], tokenize=False)
    assert run("qwen3", turns[:2], end_open=False)[2].text() == done
    assert "<think>\nA greeting.\n</think>" in done


def test_template_errors_fail_the_program_at_its_line() -> None:
    hf, _ = load("gemma-2-it")
    with pytest.raises(Exception, match="System role not supported"):
        hf.apply_chat_template(SYSTEM + USER_FIRST, tokenize=False)
    with pytest.raises(plait.ProgramError, match=r"test_chat_templates.py:\d+.*System role"):
        run("gemma-2-it", SYSTEM + USER_FIRST, end_open=False)


@plait.program
def free_text_then_turn(s):  # type: ignore[no-untyped-def]
    s += plait.system("You are terse.") + plait.user("Hi!")
    s += "Answer in French. "  # outside roles
    s += plait.assistant(plait.gen("a"))
    s += plait.user("More?")


def test_text_outside_roles_stays_where_it_was_written() -> None:
    _, template = load("smollm2-135m-instruct")
    backend = Recorder(template, ["Salut !"])
    state = free_text_then_turn.run(backend=backend)
    assert backend.prompts[0].endswith("Hi!<|im_end|>\nAnswer in French. <|im_start|>assistant\n")
    assert state.text().endswith("Salut !<|im_end|>\n<|im_start|>user\nMore?<|im_end|>\n")
    # Mistral moves the system prompt into the last user turn: past the free text, an error
    _, template = load("mistral-7b-instruct-v0.3")
    with pytest.raises(plait.ProgramError, match="outside roles"):
        free_text_then_turn.run(backend=Recorder(template, ["Salut !"]))


@pytest.mark.parametrize("name", NAMES)
def test_a_batch_caches_the_text_a_run_renders(name: str) -> None:
    """`run_batch` caches the leading text it traces: the same text the run writes."""
    turns = USER_FIRST if name in NO_SYSTEM_ROLE else SYSTEM + USER_FIRST
    hf, template = load(name)
    nodes = conversation.trace(turns=turns, end_open=False)
    prompt = hf.apply_chat_template(turns[:-1], tokenize=False, add_generation_prompt=True)
    assert leading_text(nodes, template) == prompt


def test_roles_do_not_nest() -> None:
    @plait.program
    def nested(s):  # type: ignore[no-untyped-def]
        with s.user():
            s += "a" + plait.assistant("b")

    _, template = load("smollm2-135m-instruct")
    with pytest.raises(plait.ProgramError, match="cannot start inside the open user"):
        nested.run(backend=Recorder(template, []))


def test_http_backend_renders_with_the_servers_template(plait_server: plait.Runtime) -> None:
    """HttpBackend takes the template and special tokens from /get_model_info."""
    from plait.backend.model.builtin import resolve_model_path
    from plait.backend.text.tokenizer import load_tokenizer
    from plait.clients.http import HttpBackend

    backend = HttpBackend(plait_server.url)
    tokenizer = load_tokenizer(resolve_model_path("plait-tiny"))
    for messages in (USER_FIRST, SYSTEM + MULTI_TURN):
        for gen_prompt in (True, False):
            ours = backend.chat_template.render(messages, add_generation_prompt=gen_prompt)
            theirs = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=gen_prompt
            )
            assert ours == theirs


def test_a_rendered_bos_is_not_doubled() -> None:
    """Templates write the BOS token (Llama, Mistral, Gemma): a tokenizer that adds one
    itself must not add a second, as the chat endpoint (add_special_tokens=False) adds none."""
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from tokenizers.processors import TemplateProcessing

    from plait.backend.engine.tokenizer_manager import TokenizerManager

    def manager(adds_bos: bool) -> TokenizerManager:
        tok = Tokenizer(WordLevel({"[unk]": 0, "<s>": 1, "hi": 2}, unk_token="[unk]"))
        tok.pre_tokenizer = WhitespaceSplit()
        if adds_bos:
            tok.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>")
        return TokenizerManager(tokenizer=hf, send=lambda message: None)

    assert manager(True).encode("hi") == [1, 2]
    assert manager(True).encode("<s> hi") == [1, 2]
    assert manager(False).encode("<s> <s> hi") == [1, 1, 2]  # the text's own, kept
