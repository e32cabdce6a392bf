"""Small C kernels for the CPU path, compiled at first use and called through ctypes.

The sources live in ``csrc`` beside this file. Each is built once per machine with the C compiler
(``$CC``, else ``cc``; Triton needs one too) into ``$PLAIT_CACHE_DIR`` (default
``~/.cache/plait``), named by a hash of the source, the shared headers (``csrc/*.h``) and the
flags, so an edit rebuilds it. Builds write
a temporary file and rename it, so processes starting together do not see half-written files.
When no compiler works, :func:`load_native` warns once and returns None and callers take their
torch path instead.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import subprocess
import tempfile
import warnings
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
# -fno-trapping-math changes no result (nothing here reads FP exception flags) and lets the
# vectorizer if-convert loops with float selects (exp_nonpos in a softmax or silu).
CFLAGS = ("-O3", "-shared", "-fPIC", "-std=c99", "-fopenmp-simd", "-fno-trapping-math")
LIBS = ("-lm",)
# Most builds take seconds; quant_matmul_cpu.c, which compiles its loops for five ISAs, took
# about 7 minutes of one idle core on an AVX2 EPYC (nearly all of it the AVX-512, VNNI and AMX
# copies; the AVX2 one alone builds in about 17 s), and a loaded machine stretches that.
BUILD_TIMEOUT_S = 1800


def cache_dir() -> Path:
    """Where built libraries are kept (beside the builtin models' cache)."""
    root = os.environ.get("PLAIT_CACHE_DIR") or Path.home() / ".cache" / "plait"
    return Path(root) / "native"


def build_library(source: Path, *, cc: str, out_dir: Path) -> Path:
    """Compile ``source`` into a shared library under ``out_dir`` (reused when already built).

    Raises RuntimeError with the compiler's message when the build fails.
    """
    text = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(CSRC.glob("*.h")))
    key = hashlib.sha256(text + " ".join((cc, *CFLAGS, *LIBS)).encode()).hexdigest()[:16]
    target = out_dir / f"{source.stem}-{key}-{platform.machine()}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        cmd = [*shlex.split(cc), *CFLAGS, f"-I{CSRC}", "-o", tmp, str(source), *LIBS]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()[:2000]}")
        os.replace(tmp, target)
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"cannot compile {source.name} with {cc!r}: {e}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.cache
def load_native(name: str) -> ctypes.CDLL | None:
    """The library built from ``csrc/<name>.c``, or None (with one warning) if it cannot be."""
    try:
        path = build_library(
            CSRC / f"{name}.c", cc=os.environ.get("CC") or "cc", out_dir=cache_dir()
        )
        return ctypes.CDLL(str(path))
    except (RuntimeError, OSError) as e:
        warnings.warn(
            f"plait: native CPU kernel {name!r} unavailable, using the torch path: {e}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


@functools.cache
def pool_function() -> int | None:
    """Address of ``plait_pool_run`` (``csrc/thread_pool.c``), or None (then one thread)."""
    lib = load_native("thread_pool")
    return None if lib is None else ctypes.cast(lib.plait_pool_run, ctypes.c_void_p).value
