"""An SGLang frontend program run against a plait server: `python sglang_program.py URL`.

Runs in an interpreter that has `sglang` installed (not plait's environment: sglang is no
dependency of plait); `test_server_sglang_frontend.py` starts it. Uses gen, select, fork,
run_batch, streaming and logprobs through `sgl.RuntimeEndpoint`, checks the structure of
what comes back, and prints one JSON line with the results.
"""

from __future__ import annotations

import json
import sys

import sglang as sgl


@sgl.function
def qa(s, question):  # type: ignore[no-untyped-def]
    s += "Question: " + question + "\n"
    s += "Answer:" + sgl.gen("answer", max_tokens=8, temperature=0, ignore_eos=True)
    s += "\nVerdict: " + sgl.select("verdict", choices=["yes", "no", "maybe"])
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"\nIdea {i}:" + sgl.gen("idea", max_tokens=6, temperature=0, ignore_eos=True)
    forks.join()
    s += "\nIdeas: " + forks[0]["idea"] + " / " + forks[1]["idea"]


@sgl.function
def logprob_gen(s):  # type: ignore[no-untyped-def]
    s += "Count: one two"
    s += sgl.gen("next", max_tokens=3, temperature=0, ignore_eos=True, return_logprob=True,
                 top_logprobs_num=2, return_text_in_logprobs=True)  # fmt: skip


def main(url: str) -> None:
    sgl.set_default_backend(sgl.RuntimeEndpoint(url))
    state = qa.run(question="What is plait?")
    assert isinstance(state["answer"], str), state
    assert state["verdict"] in ("yes", "no", "maybe"), state["verdict"]
    batch = qa.run_batch([{"question": "a?"}, {"question": "b?"}], num_threads=2)
    assert all(s["verdict"] in ("yes", "no", "maybe") for s in batch)
    streamed = qa.run(question="What is plait?", stream=True)
    chunks = list(streamed.text_iter())
    assert "".join(chunks) == state.text(), (chunks, state.text())
    lp = logprob_gen.run()
    meta = lp.get_meta_info("next")
    assert len(meta["output_token_logprobs"]) == 3, meta
    assert all(len(top) == 2 for top in meta["output_top_logprobs"]), meta
    result = {
        "answer": state["answer"],
        "verdict": state["verdict"],
        "ideas": state.text().rsplit("\nIdeas: ", 1)[1],
        "batch_verdicts": [s["verdict"] for s in batch],
        "stream_chunks": len(chunks),
        "stream_equals_non_stream": "".join(chunks) == state.text(),
        "logprob_tokens": [t[2] for t in meta["output_token_logprobs"]],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
