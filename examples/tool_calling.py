"""OpenAI-style tool calling against a `plait serve` server: the model calls a function, the
program runs it and sends the result back, the model answers.

python examples/tool_calling.py        (needs the `openai` package)

On plait-tiny's random weights the text is noise, but every call names an offered function
and its arguments satisfy that function's JSON Schema.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import openai

import plait

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 32},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}


def get_weather(city: str, unit: str) -> dict[str, Any]:
    return {"city": city, "temperature": 21 if unit == "celsius" else 70, "unit": unit}


def main(url: str | None = None) -> list[dict[str, Any]]:
    """Run one call-and-answer round; returns the conversation."""
    with contextlib.ExitStack() as stack:
        if url is None:  # start a server on the default model
            url = stack.enter_context(plait.Runtime()).url
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Lisbon?"}]
        first = client.chat.completions.create(
            model="plait-tiny",
            messages=messages,  # type: ignore[arg-type]
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            tool_choice="required",
            max_tokens=96,
            seed=1,
        ).choices[0]
        calls = first.message.tool_calls or []
        messages.append(first.message.model_dump(exclude_none=True))
        for call in calls:
            result = get_weather(**json.loads(call.function.arguments))  # type: ignore[union-attr]
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}
            )
        answer = client.chat.completions.create(
            model="plait-tiny",
            messages=messages,  # type: ignore[arg-type]
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            tool_choice="none",
            max_tokens=32,
            seed=2,
        ).choices[0]
        messages.append(answer.message.model_dump(exclude_none=True))
    for message in messages:
        print(json.dumps(message, ensure_ascii=False)[:200])
    return messages


if __name__ == "__main__":
    main()
