"""Атомарная запись файлов: временный файл рядом с целью, fsync, ``os.replace``, fsync каталога.

Читатель в любой момент видит либо старый файл целиком, либо новый целиком; сбой посреди
записи оставляет старый файл и не оставляет временных (их имена — ``.<имя>.<случайное>.tmp``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync каталога: переименование в нём переживёт сбой питания (где каталог можно открыть)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_synced(path: str | os.PathLike, data: bytes) -> None:
    """Байты data в path и fsync файла — для файлов ещё не опубликованного каталога."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def temp_file(directory: str | os.PathLike, name: str, write: Callable[[IO[bytes]], object]) -> str:
    """Временный файл ``.<name>.….tmp`` в directory: write(f), fsync; путь к нему.

    Права 0644, как у обычного open (mkstemp создаёт 0600). При ошибке файл удаляется.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        os.chmod(tmp, 0o644)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Атомарно заменяет path текстом text в UTF-8 (временный файл, os.replace); Path цели."""
    path, data = Path(path), text.encode("utf-8")
    tmp = temp_file(path.parent, path.name, lambda f: f.write(data))
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return path
