"""`not`, `if`/`then`/`else` and the dependency keywords, as schemas without them.

xgrammar has no form for these keywords; each has an exact one wherever the complement of a
schema has (negate.py):

    S and not N                        == S and negate(N)
    S and if I then T else E           == S and anyOf[I and T, negate(I) and E]
    S and dependentRequired {a: [b]}   == S and anyOf[not an object, an object without a,
                                                      an object with a and b]
    S and dependentSchemas {a: D}      == S and anyOf[not an object, an object without a,
                                                      an object with a, and D]

The two branches of a conditional are disjoint (a value matches I or not), and so are those
of a dependency. An object without `a` is written `properties: {a: false}`, which the last
boolean pass turns into what xgrammar enforces (booleans.py). `dependencies` (draft 7) is
either dependency keyword by its value. The caller merges each `Condition` into the schema
(the anyOfs distribute over the rest of it); a keyword whose form is missing stays, with
its warning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plait.backend.grammar.schema.merge import Merger
from plait.backend.grammar.schema.negate import Negator, any_of
from plait.backend.grammar.schema.types import JSON_TYPES
from plait.backend.grammar.schema.utils import NEVER

NOT_OBJECT = {"type": [t for t in JSON_TYPES if t != "object"]}
DEPENDENCY_KEYWORDS = ("dependentRequired", "dependentSchemas", "dependencies")


@dataclass(frozen=True)
class Condition:
    """Keywords of a schema and the schema (without them) that means the same."""

    keywords: tuple[str, ...]
    schema: Any


def _numeric(node: dict[str, Any]) -> bool:
    """A number's `not` of `integer` or of a step: a rule of its own enforces it."""
    negated = node.get("not")
    numbers = node.get("type") in ("number", "integer")
    return numbers and (negated == {"type": "integer"} or set(negated or {}) == {"multipleOf"})


class Conditions:
    """The conditions of one schema object (`found`), each with its exact form."""

    def __init__(self, *, merger: Merger, negator: Negator) -> None:
        self.merger = merger
        self.negator = negator

    def found(self, node: dict[str, Any], *, depth: int) -> list[Condition]:
        out = []
        if "not" in node and not _numeric(node):
            negated = self.negator.negate(node["not"], depth=depth)
            out += [] if negated is None else [Condition(("not",), negated)]
        if any(k in node for k in ("if", "then", "else")):
            conditional = self._conditional(node, depth=depth)
            out += [] if conditional is None else [conditional]
        for key in DEPENDENCY_KEYWORDS:
            dependency = self._dependencies(key, node.get(key), depth=depth)
            out += [] if dependency is None else [dependency]
        return out

    def _conditional(self, node: dict[str, Any], *, depth: int) -> Condition | None:
        keys = ("if", "then", "else")
        if "if" not in node or ("then" not in node and "else" not in node):
            return Condition(keys, {})  # a lone `if`, `then` or `else` means nothing
        condition = node["if"]
        unless = self.negator.negate(condition, depth=depth)
        if unless is None:
            return None
        branches = []
        for holds, then in ((condition, node.get("then", True)), (unless, node.get("else", True))):
            merged = self.merger.merge(holds, then, depth=depth)
            if merged is None:
                return None
            branches += [] if merged is NEVER else [merged]
        return Condition(keys, any_of(branches))

    def _dependencies(self, key: str, value: Any, *, depth: int) -> Condition | None:
        if key not in DEPENDENCY_KEYWORDS or not isinstance(value, dict) or not value:
            return None
        parts = []
        for name, needed in value.items():
            part = self._dependency(name, needed, key=key, depth=depth)
            if part is None:
                return None
            parts.append(part)
        merged = self.merger.merge_all(parts, depth=depth)
        return None if merged is None else Condition((key,), merged)

    def _dependency(self, name: str, needed: Any, *, key: str, depth: int) -> Any:
        """Values that meet the dependency of `name` (None: no exact form)."""
        absent = {"type": "object", "properties": {name: False}}
        names = key == "dependentRequired" or (key == "dependencies" and isinstance(needed, list))
        if names:
            if not isinstance(needed, list) or not all(isinstance(n, str) for n in needed):
                return None
            present: Any = {"type": "object", "required": list(dict.fromkeys([name, *needed]))}
        else:
            if needed is True or needed == {}:
                return {}
            present = self.merger.merge({"type": "object", "required": [name]}, needed, depth=depth)
            if present is None:
                return None
        return any_of([NOT_OBJECT, absent, *([] if present is NEVER else [present])])
