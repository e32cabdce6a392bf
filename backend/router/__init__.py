"""Data parallelism: a router in front of N `plait serve` workers (`plait router`,
`plait serve --dp N`), sending each request to the worker whose cache most likely holds its
prefix; see docs/scale.md."""

from plait.backend.router.app import create_router_app
from plait.backend.router.config import RouterConfig

__all__ = ["RouterConfig", "create_router_app"]
