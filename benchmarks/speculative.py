"""N-gram speculative decoding on JSON extraction: one request at a time, speculation on vs off.

    python -m benchmarks.speculative [--quick] [--reps 3] [--draft-tokens 4] [--threads 1]

The real model (`smollm2-135m`, SmolLM2-135M-Instruct Q4_1) extracts every labeled document
of `tests/data/extraction` (4 schemas, 40 documents; chat prompt `instruction + doc`, greedy,
`json_schema` constrained), one request at a time, with a cold cache (flushed before each
request, so each latency includes its prefill). Two engines in this process, one with
`speculative_draft_tokens` and one without, take turns document by document, the order
swapped every repetition; the table gives the median latency per schema and overall, their
ratio, the acceptance rate (accepted / drafted tokens) and whether every output was the same
token for token (it must be). Results: `benchmarks/results/speculative.json`.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from benchmarks.common import markdown_table, median, timed, write_results

MODEL = "smollm2-135m"
DATA = Path(__file__).parents[1] / "tests" / "data" / "extraction"
SCHEMAS = ("person", "order", "event", "review")
TARGET = 1.5


def documents(per_schema: int) -> list[tuple[str, list[int], dict[str, Any]]]:
    """(schema name, chat prompt ids, schema) of every document used."""
    from plait.backend.model.builtin import resolve_model_path
    from plait.backend.text.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model_path(MODEL))
    out = []
    for name in SCHEMAS:
        schema = json.loads((DATA / f"{name}.schema.json").read_text())
        for line in (DATA / f"{name}.jsonl").read_text().splitlines()[:per_schema]:
            doc = json.loads(line)
            text = f"{doc['instruction']}\n\n{doc['doc']}"
            chat = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
            out.append((name, list(tok.encode(chat, add_special_tokens=False)), schema))
    return out


def extract(engine: Any, ids: list[int], schema: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Seconds and result of one cold extraction."""
    engine.flush_cache()
    params = {"temperature": 0.0, "max_new_tokens": 256, "json_schema": schema}
    return timed(lambda: engine.generate(input_ids=ids, sampling_params=params))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from plait.backend import Engine

    common = {"num_threads": args.threads, "kv_tokens": 16384}
    engines = {
        "off": Engine(MODEL, **common),
        "on": Engine(MODEL, speculative_draft_tokens=args.draft_tokens, **common),
    }
    docs = documents(2 if args.quick else 10)
    seconds: dict[str, list[list[float]]] = {k: [[] for _ in docs] for k in engines}
    same, drafted, accepted = True, 0, 0
    for rep in range(args.reps):
        for i, (_, ids, schema) in enumerate(docs):
            order = ["off", "on"] if (rep + i) % 2 == 0 else ["on", "off"]
            results = {}
            for key in order:
                secs, results[key] = extract(engines[key], ids, schema)
                seconds[key][i].append(secs)
            same = same and results["on"]["output_ids"] == results["off"]["output_ids"]
            usage = results["on"]["usage"]
            drafted += usage.get("spec_draft_tokens", 0)
            accepted += usage.get("spec_accepted_tokens", 0)
    stats = engines["on"].stats().extra
    for engine in engines.values():
        engine.shutdown()
    names = [name for name, _, _ in docs]
    return {"seconds": seconds, "schemas": names, "identical": same, "drafted": drafted,
            "accepted": accepted, "engine_stats": stats}  # fmt: skip


def report(data: dict[str, Any]) -> str:
    rows = []
    names = data["schemas"]
    for schema in [*SCHEMAS, "all"]:
        idx = [i for i, n in enumerate(names) if schema in (n, "all")]
        off = median([median(data["seconds"]["off"][i]) for i in idx])
        on = median([median(data["seconds"]["on"][i]) for i in idx])
        rows.append([schema, len(idx), f"{off * 1000:.0f} ms", f"{on * 1000:.0f} ms",
                     f"{off / on:.2f}x"])  # fmt: skip
    rate = data["accepted"] / data["drafted"] if data["drafted"] else 0.0
    table = markdown_table(["schema", "docs", "off (median)", "on (median)", "speedup"], rows)
    counts = f"{data['accepted']}/{data['drafted']} draft tokens"
    same = f"outputs identical: {data['identical']}"
    return f"{table}\n\nacceptance rate {rate:.2f} ({counts}); {same}; target >= {TARGET}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    load = os.getloadavg()
    data = measure(args)
    text = report(data)
    print(text)
    settings = {"draft_tokens": args.draft_tokens, "threads": args.threads, "reps": args.reps}
    loads = {"load_avg_before": load, "load_avg_after": os.getloadavg()}
    write_results("speculative", {**data, "table": text, **settings, **loads})


if __name__ == "__main__":
    main()
