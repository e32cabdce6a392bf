"""The lexical state of a JSON text prefix: the open containers, each with the separators
(`,` and `:`) seen in it, and whether the text ends inside a string. Used to steer and
identify states in `shortest_completion`; it assumes the text is a prefix the grammar
accepted (it does not validate)."""

from __future__ import annotations

from dataclasses import dataclass

OPEN = frozenset(b"{[")
CLOSE = frozenset(b"}]")
SEPARATORS = frozenset(b",:")
QUOTE, BACKSLASH = ord('"'), ord("\\")

Frame = tuple[int, int]  # (opening byte, separators seen)


@dataclass(frozen=True)
class JsonLex:
    """Immutable: `feed` returns the state after more bytes."""

    stack: tuple[Frame, ...] = ()
    in_string: bool = False
    escaped: bool = False

    @classmethod
    def scan(cls, text: bytes) -> JsonLex:
        """The state after `text`, its separator counts set to zero: states reached from
        here compare by what was written after `text`."""
        lex = cls().feed(text)
        return JsonLex(tuple((b, 0) for b, _ in lex.stack), lex.in_string, lex.escaped)

    @property
    def key(self) -> tuple[tuple[Frame, ...], bool, bool]:
        return self.stack, self.in_string, self.escaped

    def open_count(self) -> int:
        """Closing bytes still needed at least: one per open container, one for a string."""
        return len(self.stack) + int(self.in_string)

    def feed(self, data: bytes) -> JsonLex:
        stack, in_string, escaped = list(self.stack), self.in_string, self.escaped
        for byte in data:
            if in_string:
                if escaped:
                    escaped = False
                elif byte == BACKSLASH:
                    escaped = True
                elif byte == QUOTE:
                    in_string = False
            elif byte == QUOTE:
                in_string = True
            elif byte in OPEN:
                stack.append((byte, 0))
            elif byte in CLOSE and stack:
                stack.pop()
            elif byte in SEPARATORS and stack:
                stack[-1] = (stack[-1][0], stack[-1][1] + 1)
        return JsonLex(tuple(stack), in_string, escaped)
