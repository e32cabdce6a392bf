"""Structured-generation benchmarks on plait-small (CPU); every ratio is measured in one run.

1. JSON-schema-constrained decode throughput at batch 16 vs unconstrained on the same prompts
   and token counts (ignore_eos, and a schema whose output cannot end within the budget),
   jump-forward off, so the ratio is the cost of the masks (target >= 0.9).
2. Jump-forward on vs off, end to end, on a JSON-extraction workload with fixed keys
   (target >= 1.3x).
3. Compile time and mask-fill time per token, p50/p99, over the 421-schema test set.
4. Outlines (transformers, same weights) on the same test-set schemas and prompts: output
   tokens per second (target plait >= 5x) and valid-output rates side by side.

    python -m benchmarks.structured [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import jsonschema
import torch
import xgrammar as xgr

from benchmarks.common import markdown_table, median, setup_torch, timed, write_results
from plait.backend.engine.engine import Engine
from plait.backend.engine.inprocess import InProcessRuntime
from plait.backend.grammar.backend import GrammarBackend
from plait.backend.grammar.compiler import GrammarError, GrammarKey, compile_key, new_compiler
from plait.backend.grammar.vocab import tokenizer_info
from plait.backend.model.builtin import resolve_model_path

MODEL = "plait-small"
DATA = Path(__file__).parents[1] / "tests" / "data" / "jsonschema"
RECORDS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 1000,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["id", "name", "tags"],
    },
}
EXTRACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "document_type": {"enum": ["INVOICE_STATEMENT", "PURCHASE_ORDER", "SHIPPING_NOTICE"]},
        "customer_account_status": {"enum": ["ACTIVE_ACCOUNT", "SUSPENDED_ACCOUNT"]},
        "is_priority_shipment": {"type": "boolean"},
        "requires_signature_on_delivery": {"type": "boolean"},
        "number_of_line_items": {"type": "integer", "minimum": 1, "maximum": 9},
        "shipping_destination_country": {
            "enum": ["United States of America", "United Kingdom", "Germany"]
        },
        "payment_terms_in_days": {"enum": [30, 60, 90]},
        "currency_code": {"enum": ["USD", "EUR", "GBP"]},
        "reference_code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    },
    "required": [
        "document_type",
        "customer_account_status",
        "is_priority_shipment",
        "requires_signature_on_delivery",
        "number_of_line_items",
        "shipping_destination_country",
        "payment_terms_in_days",
        "currency_code",
        "reference_code",
    ],
}


def load_schemas() -> list[tuple[str, Any]]:
    return [(p.stem, json.loads(p.read_text())) for p in sorted(DATA.glob("*.json"))]


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def is_valid(schema: Any, text: str) -> bool:
    try:
        value = json.loads(text, strict=False)
    except json.JSONDecodeError:
        return False
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return bool(cls(schema).is_valid(value))


# --- 1. constrained vs unconstrained decode -------------------------------------------------
def decode_tok_s(engine: Engine, prompts: list[str], *, tokens: int, **extra: Any) -> float:
    params = [
        {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 1.0, "seed": i, **extra}
        for i in range(len(prompts))
    ]
    elapsed, outs = timed(lambda: engine.generate(prompts, params))
    assert all(len(o["output_ids"]) == tokens for o in outs), "token counts must match"
    return len(prompts) * tokens / elapsed


# Same token counts in every variant: the JSON ones are not closed early (`close_on_length`).
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "json": {"json_schema": RECORDS_SCHEMA, "jump_forward": False, "close_on_length": False},
    "json_jump": {"json_schema": RECORDS_SCHEMA, "close_on_length": False},
}


def throughput(engine: Engine, *, tokens: int, rounds: int) -> dict[str, Any]:
    """Tokens/s of each variant, run back to back in a rotating order; the ratio is the
    median of per-round ratios (the machine is shared, so rounds differ more than variants)."""
    prompts = [f"Records batch {i}:" for i in range(16)]
    decode_tok_s(engine, prompts, tokens=tokens, **VARIANTS["json"])  # compile, build masks
    runs: dict[str, list[float]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for r in range(rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            runs[name].append(decode_tok_s(engine, prompts, tokens=tokens, **VARIANTS[name]))
    ratios = [j / p for j, p in zip(runs["json"], runs["plain"], strict=True)]
    tok_s = {k: median(v) for k, v in runs.items()}
    return {"tok_s": tok_s, "runs": runs, "ratios": ratios, "ratio": median(ratios)}


def fill_times_us(engine: Engine) -> list[float]:
    """Per-row mask-fill time of every step the engine has run (µs)."""
    assert isinstance(engine.runtime, InProcessRuntime), "the benchmark runs in-process"
    hooks = engine.runtime.scheduler.grammar
    assert isinstance(hooks, GrammarBackend)
    log = hooks.filler.log
    return [1e6 * seconds / rows for seconds, rows in log]


# --- 2. jump-forward on a fixed-key extraction workload ------------------------------------
def extraction(engine: Engine, *, rounds: int, docs: int) -> dict[str, Any]:
    prompts = [
        f"Document {i}: order {1000 + 7 * i} shipped, extract the fields.\n" for i in range(docs)
    ]
    base = {"max_new_tokens": 256, "temperature": 1.0, "json_schema": EXTRACTION_SCHEMA}
    engine.generate(prompts[:1], {**base, "max_new_tokens": 4})
    seconds: dict[bool, list[float]] = {True: [], False: []}
    valid: dict[bool, int] = {True: 0, False: 0}
    for r in range(rounds):
        for jump in (True, False):
            params = [{**base, "seed": 100 * r + i, "jump_forward": jump} for i in range(docs)]
            elapsed, outs = run_batch(engine, prompts, params)
            seconds[jump].append(elapsed)
            valid[jump] += sum(is_valid(EXTRACTION_SCHEMA, o["text"]) for o in outs)
    on, off = median(seconds[True]), median(seconds[False])
    return {"on_s": on, "off_s": off, "ratio": off / on, "runs": seconds, "valid": valid,
            "outputs": docs * rounds}  # fmt: skip


def run_batch(
    engine: Engine, prompts: list[str], params: list[dict[str, Any]]
) -> tuple[float, list[dict[str, Any]]]:
    elapsed, outs = timed(lambda: engine.generate(prompts, params))
    return elapsed, list(outs)


# --- 3. compile and mask-fill times over the test set ---------------------------------------
def grammar_costs(schemas: list[tuple[str, Any]], engine: Engine) -> dict[str, Any]:
    """Compile every schema as the engine does; fill the mask before each token of a valid
    instance, first on fresh masks (built on first use) and again warm."""
    info = tokenizer_info(engine.tokenizer, engine.info.vocab_size)
    times: dict[str, list[float]] = {"compile_ms": [], "first_use_us": [], "warm_us": []}
    failed = []
    for name, data in schemas:
        try:
            compiled = compile_key(
                new_compiler(info), GrammarKey("json_schema", json.dumps(data["schema"]))
            )
        except GrammarError as exc:
            failed.append((name, str(exc)))
            continue
        times["compile_ms"].append(1e3 * compiled.compile_s)
        ids = instance_ids(data, engine.tokenizer)
        times["first_use_us"] += walk_masks(compiled.grammar, ids)
        times["warm_us"] += walk_masks(compiled.grammar, ids)
    summary = {
        k: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "max": max(v)} for k, v in times.items()
    }
    return {"schemas": len(schemas), "failed": failed, "tokens": len(times["warm_us"]), **summary}


def instance_ids(data: dict[str, Any], tokenizer: Any) -> list[int]:
    valid = [t["data"] for t in data["tests"] if t["valid"]]
    text = json.dumps(valid[0], separators=(",", ":"), ensure_ascii=False) if valid else "{"
    return list(tokenizer.encode(text, add_special_tokens=False))


def walk_masks(grammar: xgr.CompiledGrammar, ids: list[int]) -> list[float]:
    """Fill the mask before each token of `ids` (until the grammar rejects one); µs each."""
    matcher = xgr.GrammarMatcher(grammar)
    mask = xgr.allocate_token_bitmask(1, grammar.tokenizer_info.vocab_size)
    times = []
    for token in ids:
        start = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        times.append(1e6 * (time.perf_counter() - start))
        if not matcher.accept_token(token):
            break
    return times


# --- 4. Outlines --------------------------------------------------------------------------
def pick(schemas: list[tuple[str, Any]], n: int) -> list[tuple[str, Any]]:
    usable = [s for s in schemas if s[0] != "Snowplow---sp_241_Normalized"]
    step = max(1, len(usable) // n)
    return usable[::step][:n]


def plait_on(engine: Engine, chosen: list[tuple[str, Any]], *, tokens: int) -> dict[str, Any]:
    prompts = [f"JSON for {name}:" for name, _ in chosen]
    params = [
        {"max_new_tokens": tokens, "temperature": 1.0, "seed": i, "json_schema": d["schema"]}
        for i, (_, d) in enumerate(chosen)
    ]
    elapsed, outs = timed(lambda: engine.generate(prompts, params))
    produced = sum(len(o["output_ids"]) for o in outs)
    valid = sum(is_valid(d["schema"], o["text"]) for (_, d), o in zip(chosen, outs, strict=True))
    closed = sum(bool(o["finish_reason"].get("closed")) for o in outs)
    return {"seconds": elapsed, "tokens": produced, "tok_s": produced / elapsed, "valid": valid,
            "closed": closed}  # fmt: skip


def outlines_on(chosen: list[tuple[str, Any]], tokens: int) -> dict[str, Any]:
    """Each schema through `outlines.Generator` on the transformers model (same weights),
    sampled at temperature 1 like plait; Generator construction is timed apart."""
    import outlines
    import transformers

    path = resolve_model_path(MODEL)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = outlines.from_transformers(hf, cast(Any, tok))
    stats: dict[str, Any] = {"seconds": 0.0, "compile_s": 0.0, "tokens": 0, "valid": 0}
    stats["errors"] = []
    for i, (name, data) in enumerate(chosen):
        outlines_one(model, case=(i, name, data["schema"]), tokens=tokens, stats=stats)
    stats["tok_s"] = stats["tokens"] / stats["seconds"]
    stats["tok_s_with_compile"] = stats["tokens"] / (stats["seconds"] + stats["compile_s"])
    return stats


def outlines_one(
    model: Any, *, case: tuple[int, str, Any], tokens: int, stats: dict[str, Any]
) -> None:
    import outlines
    from outlines.types import JsonSchema

    i, name, schema = case
    try:
        output = JsonSchema(json.dumps(schema), whitespace_pattern="")  # compact, like plait
        build, generator = timed(lambda: outlines.Generator(model, output))
    except Exception as exc:  # noqa: BLE001 - Outlines raises many types on unsupported schemas
        stats["errors"].append((name, f"{type(exc).__name__}: {str(exc)[:120]}"))
        return
    torch.manual_seed(i)
    prompt, sampling = f"JSON for {name}:", {"do_sample": True, "temperature": 1.0}
    elapsed, text = timed(lambda: generator(prompt, max_new_tokens=tokens, **sampling))
    stats["compile_s"] += build
    stats["seconds"] += elapsed
    stats["tokens"] += len(model.hf_tokenizer.encode(text, add_special_tokens=False))
    stats["valid"] += is_valid(schema, text)


# --- report ---------------------------------------------------------------------------------
def verdict(value: float, target: float) -> str:
    return f"{value:.2f}x (>= {target}x: {'met' if value >= target else 'MISSED'})"


def ratio_rows(results: dict[str, Any]) -> list[list[Any]]:
    thr, ext = results["throughput"], results["extraction"]
    mine, peer, n = results["plait_peer"], results["outlines"], results["outlines_schemas"]
    return [
        ["JSON-schema decode tok/s, batch 16, jump-forward off", thr["tok_s"]["json"],
         f"{thr['tok_s']['plain']:.0f} unconstrained", verdict(thr["ratio"], 0.9)],
        ["  same, jump-forward on", thr["tok_s"]["json_jump"], "", ""],
        [f"JSON extraction, {results['docs']} docs, fixed keys: s", ext["on_s"],
         f"{ext['off_s']:.2f} jump-forward off", verdict(ext["ratio"], 1.3)],
        [f"{n} test-set schemas vs Outlines: output tok/s", mine["tok_s"],
         f"{peer['tok_s']:.1f} Outlines", verdict(mine["tok_s"] / peer["tok_s"], 5)],
        ["  valid outputs", f"{mine['valid']}/{n} ({mine['closed']} closed at the limit)",
         f"{peer['valid']}/{n}", ""],
    ]  # fmt: skip


def cost_rows(results: dict[str, Any]) -> list[list[Any]]:
    costs, fill = results["grammar"], results["engine_fill_us"]

    def p50_p99(d: dict[str, float], digits: int = 0) -> str:
        return f"{d['p50']:.{digits}f} / {d['p99']:.{digits}f}"

    return [
        ["compile ms over the test set, p50 / p99", p50_p99(costs["compile_ms"], 2), "", ""],
        ["mask fill us/token, first use, p50 / p99", p50_p99(costs["first_use_us"]), "", ""],
        ["mask fill us/token, warm, p50 / p99", p50_p99(costs["warm_us"]), "", ""],
        ["mask fill us/row inside the engine, p50 / p99", p50_p99(fill), "", ""],
    ]


def report(results: dict[str, Any]) -> str:
    rows = ratio_rows(results) + cost_rows(results)
    return markdown_table(["benchmark", "plait", "baseline", "ratio (target)"], rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    setup_torch()
    tokens, rounds, docs, n_peer = (32, 1, 8, 4) if args.quick else (96, 7, 16, 12)
    schemas = load_schemas()
    results: dict[str, Any] = {"model": MODEL, "docs": docs, "outlines_schemas": n_peer}
    with Engine(MODEL, kv_tokens=65536) as engine:
        results["throughput"] = throughput(engine, tokens=tokens, rounds=rounds)
        fills = fill_times_us(engine)
        results["engine_fill_us"] = {"p50": pct(fills, 0.5), "p99": pct(fills, 0.99)}
        results["extraction"] = extraction(engine, rounds=min(rounds, 3), docs=docs)
        chosen = pick(schemas, n_peer)
        results["plait_peer"] = plait_on(engine, chosen, tokens=tokens)
        results["grammar"] = grammar_costs(schemas, engine)
    results["outlines"] = outlines_on(chosen, tokens)
    print(report(results))
    write_results("structured", results)


if __name__ == "__main__":
    main()
