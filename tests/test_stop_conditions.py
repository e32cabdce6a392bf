"""Stop strings and stop regexes: matching, window sizes, streaming hold-back and trimming."""

from __future__ import annotations

import time

import pytest

from plait.backend.request import stop_conditions
from plait.backend.request.messages import DetokOptions, ReqOutput
from plait.backend.request.req import FinishReason
from plait.backend.request.sampling_params import SamplingParams
from plait.backend.request.stop_conditions import (
    UNBOUNDED_CHARS,
    StopMatch,
    StopRegexTimeout,
    Tail,
    first_stop,
    hold_back_chars,
    regex_width,
    window_chars,
)
from plait.backend.text.detokenizer import Detokenizer


def test_first_stop_is_the_earliest_and_longest_on_ties() -> None:
    text = "order 66 at 10:45, then 12:00"
    clock = r"\d\d:\d\d"
    assert first_stop(Tail(text), ("then",), (clock,)) == StopMatch(12, 17, clock)
    assert first_stop(Tail(text), ("66 at", "66"), ()) == StopMatch(6, 11, "66 at")
    assert first_stop(Tail(text), ("zz",), (r"q+",)) is None
    assert first_stop(Tail(text, start=9), ("66",), (clock,)) == StopMatch(12, 17, clock)


def test_context_before_the_window_is_seen_but_not_matched() -> None:
    # Anchors mean the start of the output, not of the checked window; \b and lookbehinds
    # see the context.
    assert first_stop(Tail("ab cd", start=2), (), (r"^\s",)) is None
    assert first_stop(Tail(" cd"), (), (r"^\s",)) == StopMatch(0, 1, r"^\s")
    assert first_stop(Tail("abcd", start=2), (), (r"\bcd",)) is None
    assert first_stop(Tail("ab cd", start=2), (), (r"(?<=b )cd",)) == StopMatch(3, 5, r"(?<=b )cd")


def test_windows_follow_the_longest_possible_match() -> None:
    assert regex_width(r"ab[0-9]{2}") == 4
    assert regex_width(r"(yes|no)\.") == 4
    assert regex_width(r"\d+") == UNBOUNDED_CHARS
    assert regex_width(r"foo(?=bar)") > 6  # room for the lookahead's text
    assert window_chars(("stop",), (r"x\d",)) == 4
    assert window_chars((), ()) == 0
    assert hold_back_chars(("abc",), ()) == 2
    assert hold_back_chars(("abc",), (r"[0-9]{5}",)) == 4
    assert hold_back_chars((), (r"\d+",)) == UNBOUNDED_CHARS - 1
    assert hold_back_chars((), ()) == 0


@pytest.mark.parametrize(
    ("patterns", "message"),
    [
        (["ok", "("], r"stop_regex\[1\] is not a valid regular expression"),
        (["a{4294967296}"], r"stop_regex\[0\] is not a valid regular expression"),
        (["(" * 1000 + ")" * 1000], r"stop_regex\[0\] is not a valid regular expression"),
        (["a*"], r"stop_regex\[0\] 'a\*' can match the empty string"),
        ([r"\b"], r"can match the empty string"),
        ([r"x*(?=\n)"], r"can match the empty string"),
    ],
)
def test_bad_stop_regexes_are_named(patterns: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):  # checked when the request is built
        SamplingParams.from_dict({"stop_regex": patterns})


def test_backtracking_patterns_are_fast_or_time_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # Patterns that take seconds to minutes with `re` on these texts.
    for pattern, text in [(r"(a+)+b", "a" * 60), (r"(.|\s)*END", "a " * 128)]:
        SamplingParams.from_dict({"stop_regex": pattern}).check_vocab(vocab_size=10)
        start = time.perf_counter()
        assert first_stop(Tail(text), (), (pattern,)) is None
        assert time.perf_counter() - start < 1.0
    monkeypatch.setattr(stop_conditions, "SEARCH_TIMEOUT_S", 1e-9)
    with pytest.raises(StopRegexTimeout, match="took longer than"):
        first_stop(Tail("1" * 200), (), (r"\d+x",))


def test_stop_regex_accepts_a_string_or_a_list() -> None:
    assert SamplingParams.from_dict({"stop_regex": r"\d"}).stop_regex == (r"\d",)
    assert SamplingParams.from_dict({"stop_regex": ["a", "b"]}).stop_regex == ("a", "b")
    with pytest.raises(ValueError, match="stop_regex"):
        SamplingParams.from_dict({"stop_regex": 3})


def stream(
    text: str, *, stop: tuple[str, ...] = (), stop_regex: tuple[str, ...] = (), keep: bool = False
) -> tuple[list[str], str]:
    """Feed `text` one character (= one id) at a time; the last output finishes the request
    at the stop the scheduler finds there (its `trim_chars` as `Req.check_finished` sets it)."""
    detok = Detokenizer(decode=lambda ids, skip: "".join(map(chr, ids)))
    opts = DetokOptions(skip_special_tokens=True, hold_chars=hold_back_chars(stop, stop_regex))
    hit = first_stop(Tail(text), stop, stop_regex)
    assert hit is not None
    finish = FinishReason("stop", hit.matched, trim_chars=0 if keep else len(text) - hit.start)
    deltas = []
    for i, ch in enumerate(text):
        last = i == len(text) - 1
        out = ReqOutput(
            rid="r",
            new_ids=[ord(ch)],
            finish=finish if last else None,
            prompt_tokens=1,
            completion_tokens=i + 1,
            cached_tokens=0,
            detok_options=opts if i == 0 else None,
        )
        deltas.append(detok.step(out))
    return deltas, "".join(deltas)


@pytest.mark.parametrize("keep", [False, True])
def test_streaming_never_sends_a_stop_and_the_end_is_cut_at_it(keep: bool) -> None:
    text = "total: 1234 units"
    deltas, joined = stream(text[:11], stop_regex=(r"\d{4}",), keep=keep)
    assert joined == ("total: 1234" if keep else "total: ")
    # Nothing of the match went out before the request finished.
    assert "1" not in "".join(deltas[:-1])
    _, joined = stream(text[:14], stop=("un",), keep=keep)
    assert joined == ("total: 1234 un" if keep else "total: 1234 ")


def test_unbounded_pattern_holds_back_a_fixed_window() -> None:
    text = "x" * 300 + "123"
    deltas, joined = stream(text, stop_regex=(r"\d+",))
    assert joined == "x" * 300
    assert len("".join(deltas[:-1])) == len(text) - 1 - (UNBOUNDED_CHARS - 1)
