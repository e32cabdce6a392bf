"""The KV cache: the paged pools of K/V slots and request rows (kv_pool.py), the radix tree of
cached prefixes over them (radix_cache.py), and the ownership of slots between requests, the
pool and the tree (kv_manager.py)."""
