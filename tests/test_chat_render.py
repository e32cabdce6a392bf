"""Chat templates in the bounded sandbox: the same text as transformers for the builtin
models' templates, and hostile templates stopped by the time and size bounds."""

from __future__ import annotations

import time

import jinja2
import pytest

from plait.backend.model.builtin import resolve_model_path
from plait.backend.text.chat_template import ChatRenderer, TemplateLimitError, TemplateLimits
from plait.backend.text.tokenizer import load_tokenizer

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!", "tool_calls": None},
    {"role": "user", "content": "What is 2+2?"},
]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("model", ["plait-tiny", "smollm2-135m"])
def test_model_templates_render_as_transformers_renders_them(model: str) -> None:
    try:
        tokenizer = load_tokenizer(resolve_model_path(model))
    except Exception as exc:  # noqa: BLE001 - the model package may be absent
        pytest.skip(f"{model}: {exc}")
    renderer = ChatRenderer(special_tokens=tokenizer.special_tokens_map, limits=TemplateLimits())
    template = tokenizer.get_chat_template()
    for add in (True, False):
        for tools in (None, TOOLS):
            ours = renderer.render(template, MESSAGES, tools=tools, add_generation_prompt=add)
            theirs = tokenizer.apply_chat_template(
                MESSAGES, tools=tools, tokenize=False, add_generation_prompt=add
            )
            assert ours == theirs


HOSTILE = [
    "{{ 'a' * 1000000000 }}",
    "{{ 'x'|center(1000000000) }}",
    "{{ 'a'.ljust(10**9) }}",
    "{{ '%1000000000d' % 1 }}",
    "{{ '{:>1000000000}'.format(1) }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}{{ ns.s }}",
    "{% for i in range(100000) %}{{ 'abcdefghij' * 10 }}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for c in 'a' * 100000 %}{% for d in 'b' * 100000 %}{% endfor %}{% endfor %}",
]


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_templates_stop_at_their_bounds(template: str) -> None:
    renderer = ChatRenderer(special_tokens={}, limits=TemplateLimits(0.5, 1 << 20))
    start = time.monotonic()
    with pytest.raises(TemplateLimitError):
        renderer.render(template, MESSAGES)
    assert time.monotonic() - start < 3.0


def test_sandbox_escapes_and_template_errors_are_errors() -> None:
    renderer = ChatRenderer(special_tokens={}, limits=TemplateLimits())
    with pytest.raises(jinja2.exceptions.SecurityError):
        renderer.render("{{ ''.__class__.__mro__[1].__subclasses__() }}", MESSAGES)
    with pytest.raises(jinja2.TemplateError, match="no tools"):
        renderer.render("{{ raise_exception('no tools') }}", MESSAGES)
    generation = "{% generation %}{{ messages[0].content }}{% endgeneration %}"
    assert renderer.render(generation, MESSAGES) == "Be brief."
