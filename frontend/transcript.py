"""A program state's text with its role messages, kept equal to the chat template's rendering.

At every role boundary the text from where the conversation began is what the model's chat
template renders for the conversation so far (`ChatTemplate.opened` / `render`): usually
the new text just extends the old, and is appended; where a template renders earlier turns
differently once another follows (Mistral moves the system prompt into the last user turn,
Qwen3 drops old think blocks, Gemma trims content), the text is rewritten from the first
character that changed. Text a program writes outside roles stays where it was written; a
rewrite that would have to move it is an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from plait.chat_template import ChatTemplate

MOVED_FREE_TEXT = (
    "the chat template renders the earlier messages differently once this {role} message is "
    "{what}, and the program wrote text outside roles before it that plait cannot place in "
    "the new rendering; put that text inside a role"
)


@dataclass(frozen=True)
class Change:
    """The text became `text[:keep] + added` (keep == the old length: an append)."""

    keep: int
    added: str


class Transcript:
    """Text, finished messages, the open role, and where the template's text stands."""

    def __init__(self) -> None:
        self.text = ""
        self.messages: list[dict[str, str]] = []
        self.roles: list[tuple[str, int]] = []  # open role, start of its content in text
        self._rendered = ""  # the template's text for the conversation so far
        self._mark: int | None = None  # where in text the template last wrote up to
        # text[anchor_text:] == (rendered + text written since mark)[anchor_rendered:]: the
        # stretch after the last text written outside roles, which a rewrite may replace
        self._anchor = (0, 0)

    def copy(self) -> Transcript:
        other = Transcript()
        other.text, other.messages = self.text, [dict(m) for m in self.messages]
        other.roles, other._rendered = list(self.roles), self._rendered
        other._mark, other._anchor = self._mark, self._anchor
        return other

    def append(self, piece: str) -> Change:
        self.text += piece
        return Change(len(self.text) - len(piece), piece)

    def open_role(self, role: str, template: ChatTemplate) -> Change:
        """Start a `role` message: the template's text up to where its content goes."""
        if self.roles:
            raise ValueError(f"a {role} message cannot start inside the open {self.roles[-1][0]}")
        change = self._render(template.opened(self.messages, role), role, opening=True)
        self.roles.append((role, len(self.text)))
        return change

    def close_role(self, role: str, template: ChatTemplate) -> Change:
        """End the open `role` message: its content becomes a message, rendered in full."""
        if not self.roles or self.roles[-1][0] != role:
            raise ValueError(f"role {role!r} ended but {self.roles[-1:]} is open")
        _, start = self.roles.pop()
        self.messages.append({"role": role, "content": self.text[start:]})
        return self._render(template.render(self.messages), role, opening=False)

    def _render(self, target: str, role: str, *, opening: bool) -> Change:
        if self._mark is None:  # the conversation begins here
            self._mark, self._anchor = len(self.text), (0, len(self.text))
        written = self.text[self._mark :]  # the open role's content, or text outside roles
        view = self._rendered + written
        if target.startswith(view):
            change = Change(len(self.text), target[len(view) :])
        elif opening and written:
            change = self._after_free_text(target, role)
        else:
            change = self._rewrite(view, target, role, opening)
        self.text = self.text[: change.keep] + change.added
        self._rendered, self._mark = target, len(self.text)
        return change

    def _after_free_text(self, target: str, role: str) -> Change:
        """Text outside roles stays; the template's new text follows it."""
        if not target.startswith(self._rendered):
            raise ValueError(MOVED_FREE_TEXT.format(role=role, what="opened"))
        self._anchor = (len(self._rendered), len(self.text))
        return Change(len(self.text), target[len(self._rendered) :])

    def _rewrite(self, view: str, target: str, role: str, opening: bool) -> Change:
        """Replace the text from the first character where the template's text changed."""
        common = len(os.path.commonprefix([view, target]))
        rendered_at, text_at = self._anchor
        if common < rendered_at:
            what = "opened" if opening else "closed"
            raise ValueError(MOVED_FREE_TEXT.format(role=role, what=what))
        return Change(text_at + common - rendered_at, target[common:])
