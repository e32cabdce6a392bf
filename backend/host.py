"""This process among its peers: its name in ps/top, how the children it starts die with it,
the cores it may run on, and how its C library's malloc keeps freed memory.
A leaf module (nothing of plait, no torch), so that the engine's processes, the grammar workers,
the tensor-parallel ranks and the router's workers share it without importing each other."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
MAX_DEFAULT_THREADS = 8
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
M_ARENA_MAX = -8
KEPT_FREE_BYTES = 1 << 30  # free memory at the heap's top beyond this goes back to the system


def set_process_name(name: str) -> None:
    """Name the process for ps/top (Linux; best effort; 15 bytes at most)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def die_with_parent(sig: signal.Signals) -> Callable[[], None]:
    """A `preexec_fn` for `subprocess.Popen`: the child gets `sig` when this process dies
    (Linux's PR_SET_PDEATHSIG), even when it is SIGKILLed. The C library is loaded here, in
    the parent, so the forked child runs no import."""
    libc = ctypes.CDLL(None, use_errno=True)
    return lambda: libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def default_threads() -> int:
    """CPU threads when `num_threads` is 0: the physical cores this process may run on (SMT
    siblings count once), at most `MAX_DEFAULT_THREADS`."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in allowed:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, min(len(cores), MAX_DEFAULT_THREADS))


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the memory a forward frees for the next one (Linux; best
    effort): one arena for every thread (M_ARENA_MAX 1: a thread's own arena hands back heaps
    it empties, whatever the trim threshold), no block mapped on its own (M_MMAP_MAX 0), and
    free memory at the heap's top handed back only beyond `KEPT_FREE_BYTES`. Otherwise each of
    a long prompt's activations (tens of MiB) is a fresh mapping that the kernel faults in and
    zeroes page by page in every forward, and unmaps at its free. What is free now (a model's
    load) is handed back first (malloc_trim). Process-wide, like every malloc setting, and the
    process's resident memory stays near its peak after a long prompt. False where the C
    library has no such calls (not glibc); an allocator preloaded in glibc's place may take
    the calls and ignore them."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        trim, opt = libc.malloc_trim, libc.mallopt
    except (OSError, AttributeError):
        return False
    trim(0)
    settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, KEPT_FREE_BYTES))
    # A list, not a generator: all() would stop at the first failure and skip the rest.
    return all([bool(opt(param, value)) for param, value in settings])
