"""The router's /metrics: its own counters per worker, then every worker's metrics with a
`worker` label, each metric family once (Prometheus text format 0.0.4).

Router metrics (label `worker`): `plait_router_requests_total` (attempts routed there),
`plait_router_cache_hits_total` (routed for a prefix match above the threshold),
`plait_router_session_hits_total` (routed for the session key), `plait_router_retries_total`
(requests that did not start there and were tried elsewhere), `plait_router_failures_total`
(failed connections, refusals and responses broken off), and the gauges
`plait_router_in_flight`, `plait_router_worker_healthy`, `plait_router_tree_chars`.
"""

from __future__ import annotations

import re

from plait.backend.router.workers import Worker

PREFIX = "plait_router_"
COUNTERS = (
    ("requests_total", "routed", "Requests routed to the worker."),
    ("cache_hits_total", "cache_hits", "Requests routed to the worker for its cached prefix."),
    ("session_hits_total", "session_hits", "Requests routed to the worker for their session."),
    ("retries_total", "retried", "Requests not started on the worker, tried on another."),
    ("failures_total", "failures", "Failed connections, refusals and broken responses."),
)
FAMILY = re.compile(r"^# (?:HELP|TYPE) (\S+)")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+.*)$")


def router_lines(workers: list[Worker]) -> list[str]:
    """The router's own counters and gauges, one sample per worker."""
    lines: list[str] = []
    for name, attr, help_text in COUNTERS:
        lines += _family(name, "counter", help_text, [(w, getattr(w, attr)) for w in workers])
    gauges = (
        ("in_flight", "Requests sent to the worker and not yet answered in full.",
         [(w, w.in_flight) for w in workers]),
        ("worker_healthy", "1 while the worker gets new requests.",
         [(w, int(w.available)) for w in workers]),
        ("tree_chars", "Characters in the worker's approximate prefix tree.",
         [(w, w.tree.chars) for w in workers]),
    )  # fmt: skip
    for name, help_text, values in gauges:
        lines += _family(name, "gauge", help_text, values)
    return lines


def _family(name: str, kind: str, help_text: str, values: list[tuple[Worker, int]]) -> list[str]:
    lines = [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}"]
    return lines + [f'{PREFIX}{name}{{worker="{_escape(w.url)}"}} {v}' for w, v in values]


def merge_worker_metrics(pages: list[tuple[str, str]]) -> list[str]:
    """(worker url, its /metrics text) pairs -> one exposition: each family's HELP and TYPE
    once, then its samples from every worker, labelled `worker="<url>"`."""
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for url, text in pages:
        family = ""
        for line in text.splitlines():
            header = FAMILY.match(line)
            if header:
                family = header.group(1)
                if line not in headers.setdefault(family, []):
                    headers[family].append(line)
            elif line and not line.startswith("#"):
                samples.setdefault(family, []).append(labelled(line, url))
    lines: list[str] = []
    for family in dict.fromkeys([*headers, *samples]):
        lines += headers.get(family, []) + samples.get(family, [])
    return lines


def labelled(line: str, url: str) -> str:
    """`name{a="b"} 1` -> `name{worker="url",a="b"} 1`."""
    match = SAMPLE.match(line)
    if match is None:
        return line
    name, labels, value = match.groups()
    worker = f'worker="{_escape(url)}"'
    return f"{name}{{{worker},{labels}}} {value}" if labels else f"{name}{{{worker}}} {value}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
