"""Structured-generation benchmarks on plait-small (CPU); every ratio is measured in one run,
for each grammar backend (xgrammar, llguidance).

1. JSON-schema-constrained decode throughput at batch 16 vs unconstrained on the same prompts
   and token counts (ignore_eos, and a schema whose output cannot end within the budget),
   jump-forward off, so the ratio is the cost of the masks (target >= 0.9); the variants of
   both backends run in one rotation with the unconstrained one.
2. Jump-forward on vs off, end to end, on a JSON-extraction workload with fixed keys
   (target >= 1.3x).
3. Compile time and mask-fill time per token, p50/p99, over the 421-schema test set
   (`structured_costs`), and the per-row fill time the engine logged.
4. Outlines (transformers, same weights) on the same test-set schemas and prompts: output
   tokens per second (target plait >= 5x) and valid-output rates side by side (plait's
   default backend, `auto`).

    python -m benchmarks.structured [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, cast

import jsonschema
import torch

from benchmarks.common import markdown_table, median, setup_torch, timed, write_results
from benchmarks.structured_costs import BACKENDS, engine_fill_us, grammar_costs
from plait.backend.engine.engine import Engine
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


def is_valid(schema: Any, text: str) -> bool:
    try:
        value = json.loads(text, strict=False)
    except json.JSONDecodeError:
        return False
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return bool(cls(schema).is_valid(value))


# --- 1. constrained vs unconstrained decode -------------------------------------------------
def decode_tok_s(
    engine: Engine, prompts: list[str], *, tokens: int, **extra: Any
) -> tuple[float, float]:
    """Output tokens per wall second and per CPU second of this process (every thread: the
    scheduler's, the mask filler's; on a shared machine the neighbours' load moves the first
    far more than the second)."""
    params = [
        {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 1.0, "seed": i, **extra}
        for i in range(len(prompts))
    ]
    cpu = time.process_time()
    elapsed, outs = timed(lambda: engine.generate(prompts, params))
    cpu = time.process_time() - cpu
    assert all(len(o["output_ids"]) == tokens for o in outs), "token counts must match"
    return len(prompts) * tokens / elapsed, len(prompts) * tokens / cpu


# Same token counts in every variant: the JSON ones are not closed early (`close_on_length`).
JSON_VARIANT = {"json_schema": RECORDS_SCHEMA, "close_on_length": False}
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    **{f"json_{b}": {**JSON_VARIANT, "jump_forward": False, "grammar_backend": b}
       for b in BACKENDS},
    **{f"json_jump_{b}": {**JSON_VARIANT, "grammar_backend": b} for b in BACKENDS},
}  # fmt: skip


def throughput(engine: Engine, *, tokens: int, rounds: int) -> dict[str, Any]:
    """Tokens per wall and per CPU second of each variant, run back to back in a rotating
    order; each backend's ratios are medians of per-round ratios (the machine is shared, so
    rounds differ more than variants)."""
    prompts = [f"Records batch {i}:" for i in range(16)]
    for b in BACKENDS:  # compile, build masks
        decode_tok_s(engine, prompts, tokens=tokens, **VARIANTS[f"json_{b}"])
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            runs[name].append(decode_tok_s(engine, prompts, tokens=tokens, **VARIANTS[name]))
    out: dict[str, Any] = {"runs": runs}
    for i, clock in enumerate(("wall", "cpu")):
        plain = [p[i] for p in runs["plain"]]
        ratios = {
            b: [j[i] / p for j, p in zip(runs[f"json_{b}"], plain, strict=True)] for b in BACKENDS
        }
        tok_s = {k: median([x[i] for x in v]) for k, v in runs.items()}
        out[clock] = {"tok_s": tok_s, "ratios": ratios,
                      "ratio": {b: median(v) for b, v in ratios.items()}}  # fmt: skip
    return out


# --- 2. jump-forward on a fixed-key extraction workload ------------------------------------
def extraction(engine: Engine, *, rounds: int, docs: int, backend: str) -> dict[str, Any]:
    prompts = [
        f"Document {i}: order {1000 + 7 * i} shipped, extract the fields.\n" for i in range(docs)
    ]
    base = {"max_new_tokens": 256, "temperature": 1.0, "json_schema": EXTRACTION_SCHEMA,
            "grammar_backend": backend}  # fmt: skip
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
    wall, cpu = results["throughput"]["wall"], results["throughput"]["cpu"]
    mine, peer, n = results["plait_peer"], results["outlines"], results["outlines_schemas"]
    rows = []
    for b in BACKENDS:
        ext = results["extraction"][b]
        rows += [
            [f"{b}: JSON-schema decode tok/s, batch 16, jump-forward off",
             wall["tok_s"][f"json_{b}"], f"{wall['tok_s']['plain']:.0f} unconstrained",
             verdict(wall["ratio"][b], 0.9)],
            [f"{b}:   same, per CPU-second of the engine's process",
             cpu["tok_s"][f"json_{b}"], f"{cpu['tok_s']['plain']:.0f} unconstrained",
             verdict(cpu["ratio"][b], 0.9)],
            [f"{b}: same, jump-forward on", wall["tok_s"][f"json_jump_{b}"], "", ""],
            [f"{b}: JSON extraction, {results['docs']} docs, fixed keys: s", ext["on_s"],
             f"{ext['off_s']:.2f} jump-forward off", verdict(ext["ratio"], 1.3)],
        ]  # fmt: skip
    rows += [
        [f"auto: {n} test-set schemas vs Outlines: output tok/s", mine["tok_s"],
         f"{peer['tok_s']:.1f} Outlines", verdict(mine["tok_s"] / peer["tok_s"], 5)],
        ["  valid outputs", f"{mine['valid']}/{n} ({mine['closed']} closed at the limit)",
         f"{peer['valid']}/{n}", ""],
    ]  # fmt: skip
    return rows


def cost_rows(results: dict[str, Any]) -> list[list[Any]]:
    def p50_p99(d: dict[str, float], digits: int = 0) -> str:
        return f"{d['p50']:.{digits}f} / {d['p99']:.{digits}f}"

    rows = []
    for b in BACKENDS:
        costs, fill = results["grammar"][b], results["engine_fill_us"].get(b)
        done = costs["schemas"] - len(costs["failed"])
        rows += [
            [f"{b}: compile ms over the test set ({done} compiled), p50 / p99",
             p50_p99(costs["compile_ms"], 2), "", ""],
            [f"{b}: mask fill us/token, first use, p50 / p99", p50_p99(costs["first_use_us"]),
             "", ""],
            [f"{b}: mask fill us/token, warm, p50 / p99", p50_p99(costs["warm_us"]), "", ""],
            [f"{b}: mask fill us/row inside the engine, p50 / p99",
             p50_p99(fill) if fill else "-", "", ""],
        ]  # fmt: skip
    return rows


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
        results["engine_fill_us"] = engine_fill_us(engine)
        results["extraction"] = {
            b: extraction(engine, rounds=min(rounds, 3), docs=docs, backend=b) for b in BACKENDS
        }
        chosen = pick(schemas, n_peer)
        results["plait_peer"] = plait_on(engine, chosen, tokens=tokens)
        results["grammar"] = grammar_costs(schemas, engine)
    results["outlines"] = outlines_on(chosen, tokens)
    print(report(results))
    write_results("structured", results)


if __name__ == "__main__":
    main()
