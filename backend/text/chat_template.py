"""Chat templates rendered within bounds: a Jinja sandbox that limits time and size.

Every chat template, the model's own and (only when the server allows it) one a request
brings in `chat_template_kwargs.chat_template`, renders in `BoundedSandbox`: transformers'
sandbox (immutable, no attribute escapes) with the same globals and filters as
`apply_chat_template`, plus

- a deadline (`TemplateLimits.timeout_s`): a trace hook in the rendering thread checks it at
  every line and call of the template's code, so nested loops end with an error;
- a size bound (`max_chars`): `*`, `**`, `+` and `%` refuse results beyond it, as do calls
  and filters given a number beyond it (`"a" * 10**9`, `"x"|center(10**9)`) and format
  strings with such widths; the output stops at it.

The server renders on a worker thread, never on the event loop.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import wraps
from types import FrameType
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

COMPILED_CACHE = 16
_WIDTH = re.compile(r"\d{7,}")  # a width or precision of a million or more
# functions and filters whose numeric argument is the size of what they return
_SIZED = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "do_center", "do_indent"})


class TemplateLimitError(jinja2.TemplateError):
    """A template ran past its time or size bound."""


@dataclass(frozen=True)
class TemplateLimits:
    """How long a render may take and how many characters any value or the output may hold."""

    timeout_s: float = 5.0
    max_chars: int = 1 << 22


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


class _TemplateNamespace(Namespace):
    """`namespace(...)` without underscore attributes (as transformers does)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        for name in dict(*rest, **kwargs):
            _TemplateNamespace._check(name)
        Namespace.__init__(self, *rest, **kwargs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """transformers' chat-template sandbox with a bound on the size of what it computes."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, *, max_chars: int) -> None:
        super().__init__(
            trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
        )
        self.max_chars = max_chars
        self.filters = {name: self._bounded(f) for name, f in self.filters.items()}
        self.filters["tojson"] = self._bounded(_tojson)
        self.globals.update(
            raise_exception=_raise_exception,
            strftime_now=lambda fmt: datetime.now().strftime(fmt),
            dict=_TemplateDict(),
            namespace=_TemplateNamespace,
        )

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self._check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        name = getattr(__obj, "__name__", "")
        if name in _SIZED:
            __self._check_args(args, kwargs)
        if name in ("format", "format_map"):  # str.format, maybe behind jinja's wrapper
            target = getattr(__obj, "__wrapped__", __obj)
            __self._check_format(getattr(target, "__self__", None))
        return super().call(__context, __obj, *args, **kwargs)

    def _check_binop(self, operator: str, left: Any, right: Any) -> None:
        limit = self.max_chars
        if operator == "*" and isinstance(right, int) and hasattr(left, "__len__"):
            left, right = right, left
        if operator == "*" and isinstance(left, int) and hasattr(right, "__len__"):
            size = abs(left) * len(right)
        elif operator == "+" and hasattr(left, "__len__") and hasattr(right, "__len__"):
            size = len(left) + len(right)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            size = max(abs(left), 2).bit_length() * max(right, 0) // 3  # ~decimal digits
        elif operator == "%":
            self._check_format(left)
            size = 0
        else:
            size = 0
        if size > limit:
            raise TemplateLimitError(f"a value would exceed {limit} characters")

    def _check_args(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        for value in (*args, *kwargs.values()):
            if (
                isinstance(value, int)
                and not isinstance(value, bool)
                and abs(value) > self.max_chars
            ):
                raise TemplateLimitError(f"the number {value} is too large for a chat template")

    def _check_format(self, text: Any) -> None:
        if isinstance(text, str) and _WIDTH.search(text):
            raise TemplateLimitError("a format width or precision is too large")

    def _bounded(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(fn)  # keeps jinja's pass_context/pass_environment marks
        def bounded(*args: Any, **kwargs: Any) -> Any:
            if fn.__name__ in _SIZED:
                self._check_args(args, kwargs)
            if fn.__name__ == "do_format" and args:
                self._check_format(args[0])
            return fn(*args, **kwargs)

        return bounded


class _TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)` without exposing the type (as transformers does)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
    sort_keys: bool = False,
) -> str:  # fmt: skip
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class ChatRenderer:
    """Renders chat messages through a template under `limits`; keeps the last compiled
    templates."""

    def __init__(self, *, special_tokens: Mapping[str, Any], limits: TemplateLimits) -> None:
        self.special_tokens = dict(special_tokens)
        self.limits = limits
        self.env = BoundedSandbox(max_chars=limits.max_chars)
        self._compiled: OrderedDict[str, jinja2.Template] = OrderedDict()
        self._lock = threading.Lock()

    def render(
        self,
        template: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The prompt text; raises jinja2.TemplateError (TemplateLimitError past a bound)."""
        clean = [{k: v for k, v in m.items() if v is not None} for m in messages]
        variables = {
            **self.special_tokens,
            **kwargs,
            "messages": clean,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        with _deadline(time.monotonic() + self.limits.timeout_s, self.limits.timeout_s):
            compiled = self._compile(template)
            return self._collect(compiled.generate(**variables))

    def _compile(self, template: str) -> jinja2.Template:
        with self._lock:
            compiled = self._compiled.get(template)
            if compiled is not None:
                self._compiled.move_to_end(template)
                return compiled
        compiled = self.env.from_string(template)
        with self._lock:
            self._compiled[template] = compiled
            while len(self._compiled) > COMPILED_CACHE:
                self._compiled.popitem(last=False)
        return compiled

    def _collect(self, chunks: Any) -> str:
        out: list[str] = []
        size = 0
        for chunk in chunks:
            size += len(chunk)
            if size > self.limits.max_chars:
                raise TemplateLimitError(f"the output exceeds {self.limits.max_chars} characters")
            out.append(chunk)
        return "".join(out)


class _deadline:  # noqa: N801 - used as a context manager, like a function
    """Raise TemplateLimitError in this thread once `deadline` passes (checked by a trace hook
    at every call, and at every line of template code)."""

    def __init__(self, deadline: float, timeout_s: float) -> None:
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.previous: Any = None

    def _check(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"the chat template took longer than {self.timeout_s:g}s")

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        self._check()
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        self._check()
        return self._local if frame.f_code.co_filename == "<template>" else None

    def __enter__(self) -> None:
        self.previous = sys.gettrace()
        sys.settrace(self._global)

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self.previous)
