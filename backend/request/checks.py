"""The checks every request passes before it runs, defined once for the Engine, the server
edge (400s) and the scheduler (which sees requests from any client).

Each raises `RequestError`, a ValueError that names the offending field as the caller spells
it (the server's `param`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class RequestError(ValueError):
    """A request the engine cannot run; `field` names the offending field (or None)."""

    def __init__(self, message: str, *, field: str | None) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_error, (type(self), str(self), self.field)


def _rebuild_error(kind: type[RequestError], message: str, field: str | None) -> RequestError:
    return kind(message, field=field)


@dataclass(frozen=True)
class Prompts:
    """The token ids of each prompt of a request; `single`: one prompt was given (not a
    batch); `field`: where the prompts came from (for error messages)."""

    ids: list[list[int]]
    single: bool
    field: str


def prompt_batch(
    *,
    text: str | Sequence[str] | None,
    input_ids: Sequence[int] | Sequence[Sequence[int]] | None,
    encode: Callable[[str], list[int]],
    text_field: str = "text",
    ids_field: str = "input_ids",
    max_chars: int | None = None,
) -> Prompts:
    """Normalize a request's prompts, given as text (a string or a list of strings) or as
    token ids (a list of ids or a list of id lists), exactly one of the two. A text longer
    than `max_chars` (more than the context could hold, however it tokenizes) is refused
    before it is tokenized."""
    if (text is None) == (input_ids is None):
        raise RequestError(
            f"{text_field}: give exactly one of {text_field} or {ids_field}", field=text_field
        )
    if text is not None:
        texts = [text] if isinstance(text, str) else list(text)
        for t in texts:
            check_text(t, field=text_field)
            if max_chars is not None and len(t) > max_chars:
                raise RequestError(
                    f"{text_field}: the prompt has {len(t)} characters, more than the model's "
                    f"context can hold ({max_chars})",
                    field=text_field,
                )
        prompts = Prompts([encode(t) for t in texts], isinstance(text, str), text_field)
    else:
        assert input_ids is not None
        single = not input_ids or isinstance(input_ids[0], int)
        batch: list[Any] = [input_ids] if single else list(input_ids)
        prompts = Prompts([[int(t) for t in ids] for ids in batch], single, ids_field)
    if not prompts.ids or any(not ids for ids in prompts.ids):
        raise RequestError(f"{prompts.field}: the prompt is empty", field=prompts.field)
    return prompts


def check_text(text: str, *, field: str) -> None:
    """A RequestError naming `field` unless `text` is valid Unicode text (not a lone
    surrogate, which JSON's \\ud800 escape can carry but no tokenizer can encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        message = f"{field}: not valid Unicode text (a lone surrogate at character {exc.start})"
        raise RequestError(message, field=field) from None


def check_token_ids(ids: Sequence[int], *, vocab_size: int, field: str = "input_ids") -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(
            f"{field}: token ids out of the model's vocabulary (0..{vocab_size - 1}): {bad[:5]}",
            field=field,
        )


def check_lengths(
    *,
    prompt_len: int,
    max_new_tokens: int,
    context_len: int,
    pool_size: int | None = None,
    prompt_field: str = "input_ids",
    max_field: str = "max_new_tokens",
) -> None:
    """The prompt and its new tokens must fit the model's context and the whole KV pool."""
    if prompt_len > context_len:
        raise RequestError(
            f"{prompt_field}: the prompt has {prompt_len} tokens; the model's context length "
            f"is {context_len} tokens",
            field=prompt_field,
        )
    total = prompt_len + max_new_tokens
    if total > context_len:
        raise RequestError(
            f"{max_field}: prompt ({prompt_len} tokens) + {max_field} ({max_new_tokens}) = "
            f"{total} exceeds the model's context length of {context_len} tokens",
            field=max_field,
        )
    if pool_size is not None and total > pool_size:
        field = prompt_field if prompt_len >= pool_size else max_field
        raise RequestError(
            f"{field}: the request needs {total} tokens of KV cache; the whole KV pool "
            f"holds {pool_size}",
            field=field,
        )
