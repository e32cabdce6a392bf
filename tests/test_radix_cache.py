"""RadixCache against a naive reference, with integrity checked after every operation."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.backend.cache.kv_pool import TokenToKVPool
from plait.backend.cache.radix_cache import RadixCache


def make_tree(num_tokens: int = 256, page_size: int = 1, disabled: bool = False) -> RadixCache:
    pool = TokenToKVPool(
        num_tokens=num_tokens,
        page_size=page_size,
        num_layers=1,
        num_kv_heads=1,
        head_dim=2,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    return RadixCache(pool=pool, disabled=disabled)


def alloc(tree: RadixCache, n: int) -> torch.Tensor:
    p = tree.page_size
    pages = tree.pool.allocate_pages(n // p)
    return (pages[:, None] * p + torch.arange(p)).flatten()


def insert_owned(tree: RadixCache, key: list[int]) -> int:
    """What a finishing request does: insert its slots, free the duplicates."""
    slots = alloc(tree, len(key))
    present = tree.insert(key, slots)
    tree.pool.free(slots[:present])
    return present


def test_split_on_partial_match_and_lock() -> None:
    tree = make_tree()
    insert_owned(tree, [1, 2, 3, 4, 5])
    m = tree.match_prefix([1, 2, 3, 9])
    assert m.length == 3
    assert m.last_node.key == [1, 2, 3]
    assert len(tree.root.children) == 1
    tree.inc_lock_ref(m.last_node)
    assert tree.protected_size() == 3 and tree.evictable_size() == 2
    assert tree.evict(100) == 2  # only the unlocked leaf [4, 5] can go
    tree.check_integrity()
    tree.dec_lock_ref(m.last_node)
    assert tree.evict(100) == 3
    tree.check_integrity()
    assert tree.total_size() == 0


def test_insert_reports_present_prefix_and_slots_match() -> None:
    tree = make_tree()
    k1 = [5, 6, 7, 8]
    s1 = alloc(tree, 4)
    assert tree.insert(k1, s1) == 0
    assert insert_owned(tree, [5, 6, 7, 9, 10]) == 3
    m = tree.match_prefix([5, 6, 7, 8, 1])
    assert m.length == 4
    assert torch.equal(m.slots, s1)
    tree.check_integrity()


def test_paged_tree_matches_whole_pages_only() -> None:
    tree = make_tree(num_tokens=64, page_size=4)
    insert_owned(tree, list(range(8)))
    assert tree.match_prefix(list(range(7))).length == 4
    assert tree.match_prefix([0, 1, 2, 3, 4, 5, 6, 7, 8]).length == 8
    assert tree.match_prefix([0, 1, 9, 9]).length == 0
    assert insert_owned(tree, [0, 1, 2, 3, 9, 9, 9, 9]) == 4
    tree.check_integrity()


def test_disabled_cache_shares_nothing() -> None:
    tree = make_tree(disabled=True)
    slots = alloc(tree, 3)
    assert tree.insert([1, 2, 3], slots) == 0
    assert tree.match_prefix([1, 2, 3]).length == 0
    tree.pool.free(slots)
    tree.check_integrity()


def test_lru_evicts_oldest_leaf_first() -> None:
    tree = make_tree()
    insert_owned(tree, [1, 1, 1])
    insert_owned(tree, [2, 2, 2])
    tree.match_prefix([1, 1, 1])  # touch: [2, 2, 2] is now least recent
    tree.evict(1)
    assert tree.match_prefix([2, 2, 2]).length == 0
    assert tree.match_prefix([1, 1, 1]).length == 3
    tree.check_integrity()


# --- property test against a naive reference ---------------------------------------------
keys = st.lists(st.integers(0, 3), min_size=1, max_size=12)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), keys),
        st.tuples(st.just("match"), keys),
        st.tuples(st.just("lock"), keys),
        st.tuples(st.just("unlock"), st.integers(0, 20)),
        st.tuples(st.just("evict"), st.integers(1, 30)),
    ),
    max_size=40,
)


def cached_sequences(tree: RadixCache) -> dict[tuple[int, ...], list[int]]:
    """Every cached prefix (page-aligned) -> its slots, read off the tree."""
    out: dict[tuple[int, ...], list[int]] = {}
    stack = [(tree.root, (), [])]
    while stack:
        node, prefix, slots = stack.pop()
        for child in node.children.values():
            key, vals = prefix, list(slots)
            for i in range(0, len(child.key), tree.page_size):
                key = key + tuple(child.key[i : i + tree.page_size])
                vals = vals + child.value[i : i + tree.page_size].tolist()
                out[key] = vals
            stack.append((child, key, vals))
    return out


@settings(max_examples=150, deadline=None)
@given(ops=ops, page_size=st.sampled_from([1, 2]))
def test_random_interleavings_match_reference(
    ops: list[tuple[str, object]], page_size: int
) -> None:
    tree = make_tree(num_tokens=48, page_size=page_size)
    ref: dict[tuple[int, ...], list[int]] = {}  # cached prefix -> slots
    locks: list = []
    for op, arg in ops:
        if op == "insert":
            key = list(arg)[: len(arg) - len(arg) % page_size]  # type: ignore[arg-type]
            if not key or tree.pool.available_size() < len(key):
                continue
            slots = alloc(tree, len(key))
            present = tree.insert(key, slots)
            expect = max((len(k) for k in ref if list(k) == key[: len(k)]), default=0)
            assert present == expect
            tree.pool.free(slots[:present])
            for i in range(page_size, len(key) + 1, page_size):
                ref.setdefault(
                    tuple(key[:i]),
                    ref.get(tuple(key[: i - page_size]), []) + slots[i - page_size : i].tolist(),
                )
        elif op in ("match", "lock"):
            key = list(arg)  # type: ignore[arg-type]
            m = tree.match_prefix(key)
            expect = max((len(k) for k in ref if list(k) == key[: len(k)]), default=0)
            assert m.length == expect
            if expect:
                assert m.slots.tolist() == ref[tuple(key[:expect])]
            if op == "lock":
                tree.inc_lock_ref(m.last_node)
                locks.append((m.last_node, tuple(key[:expect])))
        elif op == "unlock" and locks:
            node, _ = locks.pop(int(arg) % len(locks))  # type: ignore[call-overload]
            tree.dec_lock_ref(node)
        elif op == "evict":
            before = dict(ref)
            evictable = tree.evictable_size()
            freed = tree.evict(int(arg))  # type: ignore[call-overload]
            assert freed >= min(int(arg), evictable) or tree.evictable_size() == 0  # type: ignore[call-overload]
            ref = cached_sequences(tree)
            assert all(before[k] == v for k, v in ref.items()), "eviction changed surviving slots"
            assert len(before) - len(ref) == freed // page_size
            for _, locked in locks:
                assert not locked or locked in ref, "a locked prefix was evicted"
        tree.check_integrity()
        assert cached_sequences(tree) == ref
