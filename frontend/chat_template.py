"""A model's Jinja chat template, rendered the way transformers' `apply_chat_template` does.

Role text is not a fixed prefix and suffix per role: templates add a default system prompt
when the first message is not a system one (SmolLM2, Qwen2.5), a date header (Llama 3), fold
the system prompt into a user turn (Gemma 3, Mistral), or render a turn differently once
another follows (Qwen3's think blocks). So a program's roles are rendered by running the
template over the conversation so far (`plait.transcript.Transcript` keeps the text in step):

- opening an assistant turn appends the template's generation prompt (what the OpenAI
  endpoint feeds the model: `apply_chat_template(messages, add_generation_prompt=True)`);
- opening another role renders the conversation plus that message around a placeholder and
  takes the text before it;
- closing a role renders the conversation with the finished message.

The Jinja environment is the server's (`plait.backend.text.chat_template.BoundedSandbox`:
transformers' sandbox, globals and filters, with bounds on what a template computes), so a
program and the OpenAI endpoint render a conversation through the same code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from plait.backend.text.chat_template import BoundedSandbox, TemplateLimits

Message = Mapping[str, Any]

PLACEHOLDER = "\x00plait-content\x00"
# The tokenizer attributes transformers passes to a template (absent ones stay undefined).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplate:
    """A compiled chat template with the values it renders with (special tokens, kwargs)."""

    def __init__(self, source: str | None = None, variables: Mapping[str, Any] | None = None):
        self.source = source or CHATML
        self.variables = {k: v for k, v in (variables or {}).items() if v is not None}
        self._compiled = BoundedSandbox(max_chars=TemplateLimits().max_chars).from_string(
            self.source
        )

    @classmethod
    def from_jinja(cls, template: str | None, **variables: Any) -> ChatTemplate:
        """`template` (None: ChatML) rendered with `variables` (bos_token, eos_token, ...;
        None values are left undefined, as transformers leaves absent special tokens)."""
        return cls(template, variables)

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = False) -> str:
        """What `apply_chat_template(messages, tokenize=False, ...)` returns."""
        return self._compiled.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            **self.variables,
        )

    def opened(self, messages: Sequence[Message], role: str) -> str:
        """The conversation `messages` followed by an opened `role` message with no content
        yet: the generation prompt for an assistant turn, else the text the template puts
        before that message's content (the conversation alone if it does not show it)."""
        if role == "assistant":
            return self.render(messages, add_generation_prompt=True)
        text = self.render([*messages, {"role": role, "content": PLACEHOLDER}])
        if PLACEHOLDER in text:
            return text.split(PLACEHOLDER, 1)[0]
        return self.render(messages) if messages else ""
