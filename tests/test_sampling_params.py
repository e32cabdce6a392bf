"""One definition of the sampling parameters: ranges, gen()'s keywords, the API mappings."""

from __future__ import annotations

import inspect
import pickle
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.backend.request.sampling_params import (
    GEN_OPTIONS,
    MAX_SEED,
    OPENAI_FIELDS,
    RUN_OPTIONS,
    SamplingError,
    SamplingParams,
)
from plait.clients.base import Backend, ChoiceLogprobs, GenOutput, OnText

HOSTILE = [
    ({"top_k": 2**70}, "top_k"),
    ({"seed": 2**64}, "seed"),
    ({"seed": MAX_SEED, "n": 2}, "seed"),
    ({"seed": -(2**63) - 1}, "seed"),
    ({"logit_bias": [[[1], 5.0]]}, "logit_bias"),  # an unhashable key: a 400, not a 500
    ({"temperature": 1e308}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"top_p": float("nan")}, "top_p"),
    ({"max_new_tokens": 2**40}, "max_new_tokens"),
    ({"n": 10_000}, "n"),
    ({"logprob_start_len": -2}, "logprob_start_len"),
    ({"repetition_penalty": 1e9}, "repetition_penalty"),
    ({"logit_bias": {"5": 1e9}}, "logit_bias"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop": ["x"] * 1000}, "stop"),
    ({"max_new_tokens": True}, "max_new_tokens"),
    ({"top_k": 1.5}, "top_k"),
    ({"grammar_backend": "outlines"}, "grammar_backend"),
    ({"grammar_backend": 1}, "grammar_backend"),
    ({"lark": 'start: "a"', "grammar_backend": "xgrammar"}, "grammar_backend"),
    ({"lark": "x" * 70_000}, "lark"),
]


@pytest.mark.parametrize(("fields", "name"), HOSTILE)
def test_every_number_is_range_checked_and_the_error_names_the_field(
    fields: dict[str, Any], name: str
) -> None:
    with pytest.raises(SamplingError) as info:
        SamplingParams.from_dict(fields)
    assert info.value.field in (name, None) and name in str(info.value)


def test_errors_are_spelled_the_callers_way() -> None:
    with pytest.raises(SamplingError, match=r"^max_tokens: ") as info:
        SamplingParams.from_dict({"max_new_tokens": -1}, names={"max_new_tokens": "max_tokens"})
    assert info.value.field == "max_tokens"
    with pytest.raises(SamplingError, match="unknown field"):
        SamplingParams.from_dict({"bogus": 1})


def test_the_largest_seeds_and_negative_ones_still_work() -> None:
    params = SamplingParams.from_dict({"seed": MAX_SEED - 1, "n": 2})
    assert params.seed == MAX_SEED - 1
    assert SamplingParams.from_dict({"seed": -1}).seed == -1  # some UIs send -1


def test_replace_validates_like_a_new_request() -> None:
    with pytest.raises(SamplingError, match="top_logprobs_num"):
        SamplingParams().replace(return_logprob=True, top_logprobs_num=10**6)


def test_lax_mode_converts_scalars_as_openai_servers_do() -> None:
    loose = {"max_new_tokens": 3.0, "n": 2.0, "temperature": "0.5", "ignore_eos": 1}
    params = SamplingParams.from_dict(loose, lax=True)
    assert (params.max_new_tokens, params.n, params.temperature, params.ignore_eos) == (
        3,
        2,
        0.5,
        True,
    )
    with pytest.raises(SamplingError, match="max_new_tokens"):
        SamplingParams.from_dict(loose)  # the native API and the Engine stay strict
    with pytest.raises(SamplingError, match="max_new_tokens"):
        SamplingParams.from_dict({"max_new_tokens": 2.5}, lax=True)  # no silent truncation


def test_sampling_errors_survive_pickling() -> None:
    with pytest.raises(SamplingError) as info:
        SamplingParams.from_dict({"top_k": 2**70})
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is SamplingError and again.field == "top_k" and str(again) == str(info.value)


def test_gen_takes_every_per_request_option_by_its_gen_name() -> None:
    values = {
        "max_new_tokens": 5, "min_new_tokens": 1, "temperature": 0.5, "top_p": 0.9, "top_k": 3,
        "min_p": 0.1, "repetition_penalty": 1.1, "frequency_penalty": 0.2,
        "presence_penalty": 0.3, "logit_bias": {1: 2.0}, "stop": ["x"], "stop_token_ids": [1],
        "stop_regex": ["[0-9]"], "no_stop_trim": True, "ignore_eos": True,
        "skip_special_tokens": False, "seed": 4, "return_logprob": True,
        "top_logprobs_num": 2, "logprob_start_len": 0, "regex": "[a-z]+",
        "any_whitespace": True, "strict_mode": False, "jump_forward": False,
        "close_on_length": False,
    }  # fmt: skip
    options = {k: values[name] for k, name in GEN_OPTIONS.items() if name in values}
    node = plait.gen("x", **options)
    assert node.params == {GEN_OPTIONS[k]: v for k, v in options.items()}
    engine_fields = set(SamplingParams.model_fields) - {"n"}  # n: fork, not gen
    assert set(GEN_OPTIONS.values()) == engine_fields
    assert set(inspect.signature(plait.gen).parameters) == {"name", "dtype", *GEN_OPTIONS}


def test_gen_reads_one_shot_iterables_once() -> None:
    node = plait.gen("x", choices=(c for c in ["yes", "no"]), stop=iter(["."]))
    assert node.params["choices"] == ["yes", "no"] and node.params["stop"] == ["."]


def test_gen_refuses_unknown_options_and_bad_values_where_it_is_called() -> None:
    with pytest.raises(TypeError, match="max_new_tokens"):
        plait.gen("x", max_new_tokens=3)  # the engine's name; gen's is max_tokens
    with pytest.raises(ValueError, match=r"max_tokens: .*greater than or equal to 0"):
        plait.gen("x", max_tokens=-1)
    with pytest.raises(ValueError, match="top_k"):
        plait.gen("x", top_k=2**70)


class Recorder(Backend):
    """Records the params of every generate call; answers a fixed JSON text."""

    def __init__(self) -> None:
        from plait.chat_template import ChatTemplate

        self.calls: list[dict[str, Any]] = []
        self._template = ChatTemplate.from_jinja(None)

    @property
    def chat_template(self) -> Any:
        return self._template

    async def generate(
        self, text: str, params: dict[str, Any], *, on_text: OnText | None = None
    ) -> GenOutput:
        self.calls.append(params)
        return GenOutput('{"a": 1}', {"finish_reason": {"type": "stop"}})

    async def score(
        self, prefix: str, choices: Sequence[str], *, unconditional: bool = False
    ) -> list[ChoiceLogprobs]:
        raise NotImplementedError("not used")

    async def cache_prefix(self, text: str) -> dict[str, Any]:
        return {}


def test_program_options_reach_the_backend_with_run_defaults() -> None:
    @plait.program
    def prog(s: Any) -> None:
        s += plait.gen("j", json_schema={"type": "object"}, any_whitespace=True,
                       close_on_length=False, max_tokens=9)  # fmt: skip

    recorder = Recorder()
    prog.run(backend=recorder, temperature=0.0, jump_forward=False, top_k=5)
    (params,) = recorder.calls
    assert params["any_whitespace"] is True and params["close_on_length"] is False
    assert params["max_new_tokens"] == 9 and params["temperature"] == 0.0
    assert params["jump_forward"] is False and params["top_k"] == 5
    assert "json_schema" not in RUN_OPTIONS and "close_on_length" in RUN_OPTIONS
    with pytest.raises(TypeError, match="json_schema"):
        prog.run(backend=recorder, json_schema={})  # constraints are per gen, not per run


def test_docs_list_every_gen_option_and_openai_field() -> None:
    api = (Path(__file__).parents[1] / "docs" / "api.md").read_text()
    server = (Path(__file__).parents[1] / "docs" / "server.md").read_text()
    named = lambda doc, key: re.search(rf"`{key}\b", doc) is not None  # noqa: E731
    assert [k for k in GEN_OPTIONS if not named(api, k)] == []
    assert [k for k in OPENAI_FIELDS if not named(server, k)] == []
