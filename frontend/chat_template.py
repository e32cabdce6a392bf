"""Role prefixes and suffixes, derived from a model's Jinja chat template.

`s += plait.user("hi")` appends `prefix("user") + "hi" + suffix("user")`; the strings come
from rendering the model's own template around a placeholder, so any template that renders
messages one after another (ChatML, Llama 3, Mistral, ...) works.
"""

from __future__ import annotations

from dataclasses import dataclass

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from plait.ir import ROLES

PLACEHOLDER = "\x00plait-content\x00"
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ChatTemplate:
    """Text around each role's content; `assistant_stop` ends an assistant turn."""

    prefixes: dict[str, str]
    suffixes: dict[str, str]
    source: str

    def prefix(self, role: str) -> str:
        return self.prefixes[role]

    def suffix(self, role: str) -> str:
        return self.suffixes[role]

    @classmethod
    def from_jinja(cls, template: str | None, **special: str) -> ChatTemplate:
        """Split the template's rendering of one message per role around a placeholder."""
        source = template or CHATML
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        compiled = env.from_string(source)

        def render(messages: list[dict[str, str]]) -> str:
            return compiled.render(messages=messages, add_generation_prompt=False, **special)

        first = {"role": "system", "content": "x"}
        base = render([first])
        prefixes, suffixes = {}, {}
        for role in ROLES:
            # after a system message, so per-conversation headers (BOS, default system
            # prompts) are not repeated in every turn
            message = {"role": role, "content": PLACEHOLDER}
            text = render([message]) if role == "system" else render([first, message])
            if role != "system" and text.startswith(base):
                text = text[len(base) :]
            if PLACEHOLDER not in text:
                raise ValueError(f"chat template does not render a {role!r} message's content")
            prefixes[role], suffixes[role] = text.split(PLACEHOLDER, 1)
        return cls(prefixes, suffixes, source)


def _raise(message: str) -> None:
    raise TemplateError(message)
