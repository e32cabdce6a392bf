"""`RouterConfig`: every setting of `plait router` (and of the router `plait serve --dp`
starts), validated once."""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("cache_aware", "round_robin")
SESSION_HEADER = "X-Plait-Session"
WORKER_HEADER = "X-Plait-Worker"


@dataclass(frozen=True)
class RouterConfig:
    """The workers, the routing policy and its thresholds, health checks and retries.

    Cache-aware routing (SGLang's router's rule): when the load is balanced, a request goes
    to the worker whose prefix tree matches the largest part of its text if that part exceeds
    `cache_threshold`, else to the worker with the smallest tree (the most room in its cache;
    ties: the least loaded), which spreads new prefixes evenly over the caches. The load is
    imbalanced when the busiest worker has more than `balance_abs_threshold` requests in
    flight beyond the idlest and more than `balance_rel_threshold` times its count; then the
    least loaded worker gets the request whatever its cache. Each tree keeps at most
    `max_tree_chars` characters (least recently used text goes first). A tree larger than
    the worker's cache only keeps routing a prefix where it was computed before (where it is
    recomputed and cached again); a smaller one would scatter a prefix over the workers.
    """

    workers: tuple[str, ...]
    policy: str = "cache_aware"
    host: str = "127.0.0.1"
    port: int = 30000
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    log_level: str = "info"
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.5
    max_tree_chars: int = 1 << 22
    max_sessions: int = 100_000
    health_interval_s: float = 1.0
    health_timeout_s: float = 2.0
    health_failures: int = 2
    connect_timeout_s: float = 5.0
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError("the router needs at least one worker (--worker URL)")
        if len(set(self.workers)) != len(self.workers):
            raise ValueError(f"a worker is listed twice: {list(self.workers)}")
        if self.policy not in POLICIES:
            raise ValueError(f"router policy must be one of {POLICIES}, not {self.policy!r}")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError("cache_threshold must be in [0, 1]")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError("balance_abs_threshold must be >= 0, balance_rel_threshold >= 1")
        if self.health_interval_s <= 0 or self.health_timeout_s <= 0:
            raise ValueError("health_interval_s and health_timeout_s must be > 0")
        if self.health_failures < 1 or self.max_attempts < 1 or self.max_tree_chars < 1:
            raise ValueError("health_failures, max_attempts and max_tree_chars must be >= 1")
        for url in self.workers:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"worker URL {url!r} must start with http:// or https://")


def normalize_url(url: str) -> str:
    """`host:port` or `http://host:port/` -> `http://host:port`."""
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"
