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
`LlgSuiteRunner` measures llguidance the same way (the schema as the engine gives it to
llguidance, against a byte-level vocabulary; a valid instance counts as accepted in its own
key order or in the schema's, since llguidance has no any-order mode; `explained`: dropping
the keywords llguidance's warnings name makes the instance valid).
`python tests/schema_suite.py` prints the tables of docs/structured.md (`--write-expected`
records the counts `test_grammar_suite.py` asserts, for both backends).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin

from grammar_cases import (
    LlgStringChecker,
    StringChecker,
    drop_keywords,
    reordered,
    schema_order,
    strip_gaps,
    validates,
    warned_keywords,
    write,
)
from referencing.exceptions import Unresolvable

from plait.backend.grammar.compiler import GrammarError, GrammarKey, build_grammar
from plait.backend.grammar.keys import AUTO, LLGUIDANCE
from plait.backend.grammar.layout import DEFAULT_LAYOUT
from plait.backend.grammar.schema.warnings import SchemaGap

SUITE_DIR = Path(__file__).parent / "data" / "json-schema-test-suite" / "draft2020-12"
METASCHEMA = "https://json-schema.org/draft/2020-12/schema"
EXPECTED = SUITE_DIR.parent / "expected.json"
EXPECTED_FILES = {
    "xgrammar": EXPECTED,
    "llguidance": SUITE_DIR.parent / "expected_llguidance.json",
    "auto": SUITE_DIR.parent / "expected_auto.json",
}
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
    llguidance: int = 0  # groups `auto` gave to llguidance
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


class LlgSuiteRunner(SuiteRunner):
    """The same measure on llguidance's grammars (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.llg = LlgStringChecker()
        self.memo: dict[str, tuple[Any, tuple[str, ...]] | GrammarError] = {}

    def compiled(self, schema: Any) -> tuple[Any, tuple[str, ...]]:
        """llguidance's template matcher of `schema` and its warnings (GrammarError if it
        does not compile)."""
        text = json.dumps(schema, sort_keys=False)
        if text not in self.memo:
            key = dataclasses.replace(self.key(schema), backend=LLGUIDANCE)
            try:
                built = build_grammar(key)
                self.memo[text] = (self.llg.compile(built.data), built.warnings)
            except GrammarError as exc:
                self.memo[text] = exc
        found = self.memo[text]
        if isinstance(found, GrammarError):
            raise found
        return found

    def accepts(self, schema: Any, value: Any, *, any_order: bool) -> bool:
        template, _ = self.compiled(schema)
        forms = [value, reordered(value, schema_order(schema))] if any_order else [value]
        return any(self.llg.accepts(template, write(v, DEFAULT_LAYOUT)) for v in forms)

    def run_group(self, group: Group, tally: FileTally) -> None:
        try:
            _, warnings = self.compiled(group.schema)
        except GrammarError:
            tally.failed += 1
            return
        tally.instances += len(group.tests)
        for valid, value in group.tests:
            if self.accepts(group.schema, value, any_order=valid) == valid:
                continue
            tally.counts["rejected" if valid else "accepted"] += 1
            if not valid:
                tally.counts[self.llg_reason(group.schema, warnings, value)] += 1

    @staticmethod
    def llg_reason(schema: Any, warnings: tuple[str, ...], value: Any) -> str:
        """explained | warned | silent, for an invalid instance llguidance accepts."""
        keywords = warned_keywords(list(warnings))
        if not warnings:
            return "silent"
        try:
            ok = bool(keywords) and validates(drop_keywords(schema, keywords), value)
        except Unresolvable:
            ok = False
        return "explained" if ok else "warned"


class AutoSuiteRunner(SuiteRunner):
    """The same measure for `auto`: each group checked by the backend `auto` picks."""

    def __init__(self) -> None:
        super().__init__()
        self.llg = LlgSuiteRunner()

    def run_group(self, group: Group, tally: FileTally) -> None:
        key = dataclasses.replace(self.key(group.schema), backend=AUTO)
        try:
            chosen = build_grammar(key).backend
        except GrammarError:
            tally.failed += 1
            return
        if chosen == LLGUIDANCE:
            tally.llguidance += 1
            self.llg.run_group(group, tally)
        else:
            super().run_group(group, tally)


def run_suite(runner: SuiteRunner | None = None) -> dict[str, FileTally]:
    """Per file name, the tally of every group (remote ones skipped), by `runner`
    (default: xgrammar's)."""
    runner, out = runner or SuiteRunner(), {}
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


RUNNERS = {"xgrammar": SuiteRunner, "llguidance": LlgSuiteRunner, "auto": AutoSuiteRunner}


def comparison_table(by_backend: dict[str, dict[str, FileTally]]) -> str:
    """Per file with anything wrong on some backend, for each backend: invalid instances
    accepted (of them with no warning), valid instances rejected, groups not compiled;
    then the totals of the core and the format files."""
    names = list(by_backend)
    head = "| file | instances | " + " | ".join(f"{n}: accepted (silent) / rejected / failed"
                                               for n in names) + " |"  # fmt: skip
    lines = [head, "|---|---|" + "---|" * len(names)]
    files = list(next(iter(by_backend.values())))
    totals: dict[str, dict[str, FileTally]] = {n: {} for n in names}
    for name in files:
        part = "**optional/format**" if "/" in name else "**core files**"
        for n in names:
            _add(totals[n].setdefault(part, FileTally()), by_backend[n][name])
        if any(_wrong(by_backend[n][name]) for n in names):
            lines.append(_compare_row(name, [by_backend[n][name] for n in names]))
    for part in ("**core files**", "**optional/format**"):
        lines.append(_compare_row(part, [totals[n][part] for n in names]))
    return "\n".join(lines)


def _wrong(t: FileTally) -> bool:
    return bool(t.failed or t.counts["accepted"] or t.counts["rejected"])


def _compare_row(name: str, tallies: list[FileTally]) -> str:
    cells = [f"{t.counts['accepted']} ({t.counts['silent']}) / {t.counts['rejected']} / "
             f"{t.failed}" for t in tallies]  # fmt: skip
    return f"| {name} | {max(t.instances for t in tallies)} | " + " | ".join(cells) + " |"


def _add(total: FileTally, t: FileTally) -> None:
    total.instances += t.instances
    total.failed += t.failed
    total.llguidance += t.llguidance
    for k in COUNTS:
        total.counts[k] += t.counts[k]


def _table_row(name: str, t: FileTally) -> str:
    c = t.counts
    accepted = f"{c['accepted']} ({c['explained']} / {c['warned']} / {c['silent']})"
    rejected = f"{c['rejected']} ({c['rejected_explained']})"
    return f"| {name} | {t.instances} | {accepted} | {rejected} | {t.failed} |"


if __name__ == "__main__":
    by_backend = {name: run_suite(runner()) for name, runner in RUNNERS.items()}
    print(markdown_table(by_backend["xgrammar"]))
    print(comparison_table(by_backend))
    auto = by_backend["auto"]
    print("groups auto gives llguidance:", sum(t.llguidance for t in auto.values()))
    if "--write-expected" in sys.argv:  # after a deliberate change; review the diff
        for name, path in EXPECTED_FILES.items():
            rows = {file: t.row() for file, t in by_backend[name].items()}
            path.write_text(json.dumps(rows, indent=1) + "\n")
