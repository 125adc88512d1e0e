"""Real text that is already on every machine: the Python standard library's own source (chapter 7).

The corpus is every top-level module of the standard library (the ``*.py`` files directly inside
``sysconfig.get_paths()["stdlib"]``), read at run time and never copied into the repository, as bytes:
vocabulary 256, no tokenizer. Files are taken in sorted order and each goes wholly to the training or the
validation split, decided by its name alone (``crc32(name) % 10 == 0`` -> validation, about one file in ten),
so the split of a file is the same on every machine even though the set of files and their bytes differ
between Python versions.
"""

from __future__ import annotations

import pathlib
import sysconfig
import zlib
from dataclasses import dataclass

import torch

from .._checks import check_count, check_found, check_instance, check_int

__all__ = ["Corpus", "stdlib_files", "is_validation", "load_stdlib", "windows", "as_text"]


def stdlib_files(root: str | pathlib.Path | None = None) -> list[pathlib.Path]:
    """The sorted top-level ``*.py`` files of the standard library (or of ``root``)."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"] if root is None else root)
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    why = "hold *.py files (is the standard library zipped?)"
    check_found(files, "root", name="stdlib_files", expected=why, got=f"none in {str(root)!r}")
    return files


def is_validation(name: str) -> bool:
    """True when the file called ``name`` belongs to the validation split (by its name alone)."""
    return zlib.crc32(name.encode("utf-8")) % 10 == 0


@dataclass(frozen=True)
class Corpus:
    """The byte corpus and its split.

    Attributes:
        root: the folder the files were read from.
        train_files, valid_files: the file names of each split, sorted.
        train, valid: every file of the split concatenated in sorted order, (n_bytes,) uint8.
    """

    root: str
    train_files: tuple[str, ...]
    valid_files: tuple[str, ...]
    train: torch.Tensor
    valid: torch.Tensor

    def describe(self) -> str:
        """One line: where the text is from and how big each split is."""
        return (
            f"{len(self.train_files) + len(self.valid_files)} files from {self.root}: "
            f"train {len(self.train_files)} files, {self.train.numel() / 1e6:.2f} MB; "
            f"validation {len(self.valid_files)} files, {self.valid.numel() / 1e6:.2f} MB"
        )


def _read(files: list[pathlib.Path]) -> torch.Tensor:
    data = b"".join(p.read_bytes() for p in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)  # (n_bytes,)


def load_stdlib(root: str | pathlib.Path | None = None) -> Corpus:
    """Read the standard library's top-level modules and split them into training and validation bytes."""
    files = stdlib_files(root)
    train = [p for p in files if not is_validation(p.name)]
    valid = [p for p in files if is_validation(p.name)]
    where = f" (of the {len(files)} files in {str(files[0].parent)!r})"
    check_count(train, "the training split", name="load_stdlib", item="file", why=where)
    check_count(valid, "the validation split", name="load_stdlib", item="file", why=where)
    return Corpus(
        str(files[0].parent), tuple(p.name for p in train), tuple(p.name for p in valid), _read(train), _read(valid)
    )


def windows(data: torch.Tensor, starts: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-byte targets of the windows ``data[s : s + length + 1]`` for each start s.

    Returns:
        ``(x, y)``, both (len(starts), length) int64: ``y[:, i] = x[:, i + 1]`` shifted by one byte.
    """
    length = check_int(length, "length", name="windows", minimum=1)
    check_count(data, "data", name="windows", minimum=length + 1, item="byte", why=" (length + 1)")
    offsets = torch.arange(length + 1)  # (length + 1,)
    chunk = data[starts.unsqueeze(1) + offsets].long()  # (n, length + 1)
    return chunk[:, :-1], chunk[:, 1:]


def as_text(data: bytes | bytearray | torch.Tensor, width: int = 76) -> str:
    """Bytes as text for an 80-column page: decoded as UTF-8 (invalid bytes replaced), tabs expanded to 4
    spaces, unprintable characters shown as ``·`` and lines longer than ``width`` wrapped.

    ``data`` may be bytes or a tensor of byte values (a generated sequence, a slice of the corpus).
    """
    if isinstance(data, torch.Tensor):
        data = bytes(data.flatten().tolist())
    check_instance(data, "data", (bytes, bytearray), name="as_text", what="bytes or a tensor of byte values")
    width = check_int(width, "width", name="as_text", minimum=1)
    text = bytes(data).decode("utf-8", "replace").expandtabs(4)
    lines = []
    for line in text.splitlines():
        line = "".join(c if c.isprintable() else "·" for c in line)
        lines += [line[i : i + width] for i in range(0, max(len(line), 1), width)]
    return "\n".join(lines)
