"""The official JSON-Schema-Test-Suite (draft 2020-12) against plait's compiled grammars.

Every group's schema is compiled as the engine compiles it (rewrite, converter, default
`dumps` layout), without strict mode (which narrows on purpose), against an empty
vocabulary; every instance, written as `json.dumps` writes it (the `dumps` layout), is then
accepted or not: an invalid one by the engine's grammar (properties in the schema's order),
a valid one by the same grammar in any property order (xgrammar's `any_order`, which does
not check `required`, so it is not used for invalid ones). Per file:

- `accepted`: invalid instances the grammar accepts, split into `explained` (dropping the
  keywords the warnings name makes the instance valid), `warned` (warnings exist but do not
  account for it) and `silent` (no loose warning at all);
- `rejected`: valid instances the grammar rejects (`rejected_explained`: a strict warning
  accounts for it);
- `failed`: groups whose schema does not compile (their instances are not counted).

Groups whose `$ref`s point at other documents (the suite's `remotes/`) are skipped.
`python tests/schema_suite.py` prints the table of docs/structured.md (`--write-expected`
records the counts `test_grammar_suite.py` asserts).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin

from grammar_cases import StringChecker, strip_gaps, validates
from referencing.exceptions import Unresolvable

from plait.backend.grammar.compiler import GrammarError, GrammarKey
from plait.backend.grammar.layout import DEFAULT_LAYOUT
from plait.backend.grammar.schema.warnings import SchemaGap

SUITE_DIR = Path(__file__).parent / "data" / "json-schema-test-suite" / "draft2020-12"
METASCHEMA = "https://json-schema.org/draft/2020-12/schema"
EXPECTED = SUITE_DIR.parent / "expected.json"
COUNTS = ("accepted", "explained", "warned", "silent", "rejected", "rejected_explained")


@dataclass(frozen=True)
class Group:
    """One schema of a suite file and its labelled instances."""

    file: str
    description: str
    schema: Any
    tests: tuple[tuple[bool, Any], ...]


@dataclass
class FileTally:
    """What the grammar did with one file's instances."""

    instances: int = 0
    groups: int = 0
    skipped: int = 0
    failed: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))

    def row(self) -> dict[str, int]:
        return {"failed": self.failed, **{k: v for k, v in self.counts.items() if v}}


def suite_files() -> list[Path]:
    """The non-optional files, then the format files."""
    return sorted(SUITE_DIR.glob("*.json")) + sorted((SUITE_DIR / "optional").rglob("*.json"))


def file_name(path: Path) -> str:
    return str(path.relative_to(SUITE_DIR).with_suffix(""))


def load_groups(path: Path) -> list[Group]:
    groups = []
    for data in json.loads(path.read_text()):
        tests = tuple((bool(t["valid"]), t["data"]) for t in data["tests"])
        groups.append(Group(file_name(path), data["description"], data["schema"], tests))
    return groups


def _refs_and_ids(node: Any, base: str) -> Iterator[tuple[str, str]]:
    """("id"|"ref", absolute URI) for every `$id` and `$ref`/`$dynamicRef` under `node`."""
    if isinstance(node, list):
        for item in node:
            yield from _refs_and_ids(item, base)
        return
    if not isinstance(node, dict):
        return
    if isinstance(node.get("$id"), str):
        base = urljoin(base, node["$id"])
        yield "id", urldefrag(base)[0]
    for key in ("$ref", "$dynamicRef"):
        if isinstance(node.get(key), str):
            yield "ref", urljoin(base, node[key])
    for key, child in node.items():
        if key not in ("enum", "const"):
            yield from _refs_and_ids(child, base)


def is_remote(schema: Any) -> bool:
    """Whether a `$ref` points at a document the schema does not hold (a remote one), or
    its `$schema` is a metaschema other than draft 2020-12's."""
    if isinstance(schema, dict) and schema.get("$schema", METASCHEMA) != METASCHEMA:
        return True
    pairs = list(_refs_and_ids(schema, ""))
    ids = {uri for kind, uri in pairs if kind == "id"} | {""}
    return any(urldefrag(uri)[0] not in ids for kind, uri in pairs if kind == "ref")


class SuiteRunner:
    """Compiles each group once and checks its instances."""

    def __init__(self) -> None:
        self.checker = StringChecker()

    def key(self, schema: Any) -> GrammarKey:
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        return GrammarKey("json_schema", text, DEFAULT_LAYOUT, strict_mode=False)

    def accepts(self, schema: Any, value: Any, *, any_order: bool) -> bool:
        compiled, _ = self.checker.compile(self.key(schema), any_order=any_order)
        return self.checker.accepts(compiled, json.dumps(value, ensure_ascii=False))

    def run_group(self, group: Group, tally: FileTally) -> None:
        try:
            _, gaps = self.checker.compile(self.key(group.schema))
            verdicts = [
                self.accepts(group.schema, value, any_order=valid) for valid, value in group.tests
            ]
        except GrammarError:
            tally.failed += 1
            return
        tally.instances += len(group.tests)
        for (valid, value), accepted in zip(group.tests, verdicts, strict=True):
            if accepted == valid:
                continue
            tally.counts["rejected" if valid else "accepted"] += 1
            reason = self.classify(group.schema, gaps, valid=valid, value=value)
            if reason is not None:
                tally.counts[reason] += 1

    def classify(
        self, schema: Any, gaps: list[SchemaGap], *, valid: bool, value: Any
    ) -> str | None:
        """Which count an instance the grammar gets wrong goes to besides its total."""
        effect = "strict" if valid else "loose"
        named = [g for g in gaps if g.effect == effect]
        if valid:  # the loose keywords go too, as in grammar_cases.explain
            explained = bool(named) and self._accepts_stripped(schema, gaps, value)
            return "rejected_explained" if explained else None
        if not named:
            return "silent"
        try:
            return "explained" if validates(strip_gaps(schema, named), value) else "warned"
        except Unresolvable:
            return "warned"  # the stripped schema lost a $ref target: not accounted for

    def _accepts_stripped(self, schema: Any, gaps: list[SchemaGap], value: Any) -> bool:
        try:
            return self.accepts(strip_gaps(schema, gaps), value, any_order=True)
        except GrammarError:
            return False


def run_suite() -> dict[str, FileTally]:
    """Per file name, the tally of every group (remote ones skipped)."""
    runner, out = SuiteRunner(), {}
    for path in suite_files():
        tally = FileTally()
        for group in load_groups(path):
            tally.groups += 1
            if is_remote(group.schema):
                tally.skipped += 1
            else:
                runner.run_group(group, tally)
        out[file_name(path)] = tally
    return out


def markdown_table(tallies: dict[str, FileTally]) -> str:
    """Files with anything wrong, then the totals of the core files and the format files."""
    head = "| file | instances | invalid accepted (explained / warned / silent) | valid rejected"
    lines = [head + " (explained) | groups not compiled |", "|---|---|---|---|---|"]
    totals = {"**core files**": FileTally(), "**optional/format**": FileTally()}
    for name, t in tallies.items():
        _add(totals["**optional/format**" if "/" in name else "**core files**"], t)
        if t.failed or t.counts["accepted"] or t.counts["rejected"]:
            lines.append(_table_row(name, t))
    lines.extend(_table_row(name, t) for name, t in totals.items())
    return "\n".join(lines)


def _add(total: FileTally, t: FileTally) -> None:
    total.instances += t.instances
    total.failed += t.failed
    for k in COUNTS:
        total.counts[k] += t.counts[k]


def _table_row(name: str, t: FileTally) -> str:
    c = t.counts
    accepted = f"{c['accepted']} ({c['explained']} / {c['warned']} / {c['silent']})"
    rejected = f"{c['rejected']} ({c['rejected_explained']})"
    return f"| {name} | {t.instances} | {accepted} | {rejected} | {t.failed} |"


if __name__ == "__main__":
    results = run_suite()
    print(markdown_table(results))
    rows = {name: t.row() for name, t in results.items()}
    if "--write-expected" in sys.argv:  # after a deliberate change; review the diff
        EXPECTED.write_text(json.dumps(rows, indent=1) + "\n")
