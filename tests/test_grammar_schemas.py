"""The 421-schema test set against the compiled grammars, without a model.

For every schema that compiles, invalid instances must be rejected and valid ones accepted;
each exception must be explained exactly by the keywords the warning walker reports (dropping
them flips the verdict). The exceptions are tallied by keyword for the report.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from grammar_cases import (
    LLG_COMPILE_ERRORS,
    CaseResult,
    LlgStringChecker,
    StringChecker,
    analyze,
    blame,
    drop_keywords,
    explain,
    llg_analyze,
    load_cases,
    validates,
    warned_keywords,
)

from plait.backend.grammar.layout import COMPACT
from plait.backend.grammar.schema.rewrite import rewrite_schema

EXPECTED_COMPILE_ERRORS = {
    "Snowplow---sp_241_Normalized": "Integer exceeds maximum limit due to precision loss",
}


@pytest.fixture(scope="module")
def checker() -> StringChecker:
    return StringChecker()


@pytest.fixture(scope="module")
def results(checker: StringChecker) -> list[CaseResult]:
    return [analyze(case, checker) for case in load_cases()]


def test_the_test_set_is_complete() -> None:
    cases = load_cases()
    assert len(cases) == 421
    assert sum(len(c.tests) for c in cases) > 1400


def test_only_known_schemas_fail_to_compile(results: list[CaseResult]) -> None:
    errors = {r.case.name: r.error for r in results if r.error is not None}
    assert set(errors) == set(EXPECTED_COMPILE_ERRORS)
    for name, fragment in EXPECTED_COMPILE_ERRORS.items():
        assert fragment in str(errors[name])


def test_rewrite_keeps_every_verdict() -> None:
    """The rewritten schema (what is compiled) accepts exactly what the original accepts."""
    for case in load_cases():
        rewritten = rewrite_schema(case.schema)
        for _, value in case.tests:
            assert validates(rewritten, value) == validates(case.schema, value), case.name


def test_every_exception_is_explained_by_a_reported_keyword(
    results: list[CaseResult], checker: StringChecker
) -> None:
    unexplained = [
        (r.case.name, i)
        for r in results
        for i in r.accepted_invalid + r.rejected_valid
        if not explain(r, i, checker=checker)
    ]
    assert unexplained == []


def test_exceptions_by_keyword(results: list[CaseResult], checker: StringChecker) -> None:
    """Tally (printed with -s) and sanity bounds: most instances get the right verdict."""
    tally: Counter[str] = Counter()
    for r in results:
        for i in r.accepted_invalid:
            tally.update(f"invalid accepted: {k}" for k in blame(r, i, checker=checker))
        for i in r.rejected_valid:
            tally.update(f"valid rejected: {k}" for k in blame(r, i, checker=checker))
    compiled = [r for r in results if r.error is None]
    instances = sum(len(r.case.tests) for r in compiled)
    wrong = sum(len(r.accepted_invalid) + len(r.rejected_valid) for r in compiled)
    print(json.dumps({"compiled": len(compiled), "instances": instances, **tally}, indent=1))
    assert len(compiled) == 420
    assert wrong < 0.05 * instances


def test_warnings_name_the_unenforced_keywords(results: list[CaseResult]) -> None:
    """Schemas with a loose exception carry a warning for the keyword that explains it."""
    from plait.backend.grammar.schema.warnings import gap_warnings

    for r in results:
        if r.accepted_invalid:
            warnings = gap_warnings([g for g in r.gaps if g.effect == "loose"])
            assert warnings and all(w.startswith("json_schema keyword '") for w in warnings)


# --- llguidance -----------------------------------------------------------------------------
LLG_ACCEPTED_INVALID = 6  # each explained by a warning (below); as they stand
LLG_REJECTED_VALID = 16


@pytest.fixture(scope="module")
def llg_results() -> list[CaseResult]:
    checker = LlgStringChecker()
    return [llg_analyze(case, checker, layout=COMPACT) for case in load_cases()]


def test_llguidance_fails_only_on_known_schemas(llg_results: list[CaseResult]) -> None:
    errors = {r.case.name: r.error for r in llg_results if r.error is not None}
    assert set(errors) == set(LLG_COMPILE_ERRORS)
    for name, fragment in LLG_COMPILE_ERRORS.items():
        assert fragment in str(errors[name])


def test_llguidance_accepts_an_invalid_instance_only_where_a_warning_explains_it(
    llg_results: list[CaseResult],
) -> None:
    """Every invalid instance llguidance's grammar accepts is valid once the keywords its
    warnings name are dropped; none is accepted without a warning."""
    accepted = [(r, i) for r in llg_results for i in r.accepted_invalid]
    for result, i in accepted:
        keywords = warned_keywords(result.warnings)
        value = result.case.tests[i][1]
        assert keywords and validates(drop_keywords(result.case.schema, keywords), value)
    assert len(accepted) == LLG_ACCEPTED_INVALID
    assert sum(len(r.rejected_valid) for r in llg_results) == LLG_REJECTED_VALID
