"""Урок 12.5: формат полной контрольной точки RL-запуска.

``COMPONENTS`` — словарь компонентов полного состояния (учебный запуск — ``toy_run.ToyRLRun``);
``save_checkpoint`` пишет атомарно (временный каталог, fsync, ``manifest.json`` с SHA-256 последним,
переименование); ``load_checkpoint`` / ``verify_checkpoint`` / ``latest_checkpoint`` /
``scan_checkpoints`` читают с проверкой (``CheckpointError``); ``resume_full`` и
``resume_weights_only`` — честное и нечестное восстановление. Уровень C —
``multiproc.checkpointed_trainer``, проверка аварией — ``crash_test``, интервал —
``checkpoint_interval``. torch, safetensors и pandas загружаются лениво.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import math
import numbers
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from course_utils import atomic
from course_utils.args import (
    integer,
    is_int,
    is_real,
    path as _path,
)
from course_utils.fmt import count

if TYPE_CHECKING:
    from course_utils.toy_run import ToyRLRun

FORMAT = "course_utils.checkpoint/1"
MANIFEST = "manifest.json"
EVENTS_FILE = "events.jsonl"

_NAME_RE = re.compile(r"^step-(\d{6,})$")
_TMP_PREFIX = ".tmp-"  # запись идёт (или прервана): файлы данных, manifest последним
_OLD_PREFIX = ".old-"  # прежняя копия, отодвинутая при overwrite=True до переименования новой
KIND_MAIN, KIND_TMP, KIND_OLD = "основной", "временный", "старая копия"
_COMPONENT_RE = re.compile(r"^[a-z][a-z0-9_]*$")

# Компонент состояния ToyRLRun → (что в нём, что ломается без него). Порядок — порядок записи.
COMPONENTS: dict[str, tuple[str, str]] = {
    "policy": (
        "параметры политики (веса MLP), safetensors",
        "без них продолжать нечего: политика начинает с нуля",
    ),
    "optimizer": (
        "состояние AdamW: моменты m и v, счётчик шагов, гиперпараметры",
        "«холодный» оптимизатор: поправка смещения Adam начинается заново, первые шаги после "
        "перезапуска другой величины",
    ),
    "scheduler": (
        "положение планировщика скорости обучения (прогрев, затем косинус)",
        "прогрев начинается заново: скорость обучения скачет вниз, траектория другая",
    ),
    "counters": (
        "глобальный шаг, версия политики, число созданных и потерянных роллаутов",
        "роллауты получают неверные версии, журнал перезаписывает старые шаги, задержка "
        "политики считается неверно",
    ),
    "rng": (
        "состояния генераторов: Python random (перемешивание мини-пакетов), NumPy (шум "
        "верификатора), torch (выбор действий)",
        "другие действия и другой порядок обновлений: запуск перестаёт быть воспроизводимым",
    ),
    "data_cursor": (
        "положение в потоке запросов: эпоха, индекс, сколько запросов прочитано",
        "запуск снова видит первые запросы: одни примеры повторяются, другие пропускаются",
    ),
    "curriculum": (
        "учебная программа: уровень сложности, скользящая доля успехов, шагов на уровне",
        "запуск откатывается к самому лёгкому уровню",
    ),
    "normalizer": (
        "нормировщик наград: число, среднее и M2 (Уэлфорд) для преимуществ",
        "преимущества нормируются по «пустой» статистике: масштаб обновления скачет",
    ),
    "versions": (
        "версии верификатора, среды, схемы роллаута, формата запросов, настройки "
        "декодирования и раскладка процессов",
        "новые роллауты оценивает старая проверяющая система, а награды разных версий "
        "смешиваются незаметно",
    ),
    "queue": (
        "очередь роллаутов «в полёте» (созданы, но ещё не обучены) с версиями поведения",
        "пакет в полёте теряется или создаётся заново другой политикой: данные обновления меняются",
    ),
}


def components_frame():
    """Таблица pandas ``COMPONENTS``: «компонент», «что в нём», «что ломается без него»."""
    import pandas as pd

    rows = [
        {"компонент": k, "что в нём": w, "что ломается без него": m}
        for k, (w, m) in COMPONENTS.items()
    ]
    return pd.DataFrame(rows)


class CheckpointError(ValueError):
    """Контрольная точка не проходит проверку: нет файла, файл обрезан или изменён и т. п."""

    def __init__(self, message: str, path: str | os.PathLike | None = None, file: str = ""):
        super().__init__(message)
        self.path = str(path) if path is not None else ""
        self.file = file


# ----------------------------------------------------------------------------- проверки входа


def count_steps(n: int) -> str:
    """«1 шаг», «3 шага», «12 шагов»."""
    return count(n, "шаг", "шага", "шагов")


def checkpoint_name(step: int) -> str:
    """Имя каталога контрольной точки шага step: "step-000012" (шесть и более цифр)."""
    step = integer("step", step, 0)
    return f"step-{step:06d}"


# ---------------------------------------------------------------------------- кодирование состояния

_TENSOR, _TUPLE, _ITEMS, _FLOAT = "__tensor__", "__tuple__", "__items__", "__float__"


def _encode(obj: Any, where: str, tensors: dict) -> Any:
    """Состояние → JSON-скелет; тензоры уходят в tensors под именем-путём ("state/0/exp_avg")."""
    import torch

    if isinstance(obj, torch.Tensor):
        name = where or "tensor"
        if name in tensors:
            raise ValueError(f"save_checkpoint: два тензора с одним именем {name!r}")
        tensors[name] = obj.detach().cpu().contiguous().clone()
        return {_TENSOR: name}
    if obj is None or isinstance(obj, bool | str):
        return obj
    if is_int(obj):
        return int(obj)
    if isinstance(obj, numbers.Real):
        value = float(obj)
        return value if math.isfinite(value) else {_FLOAT: repr(value)}
    if isinstance(obj, tuple):
        return {_TUPLE: [_encode(v, f"{where}/{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, f"{where}/{i}", tensors) for i, v in enumerate(obj)]
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, f"{where}/{k}" if where else k, tensors) for k, v in obj.items()}
        items = []
        for k, v in obj.items():
            key = _encode(k, "", {})
            if isinstance(key, dict) and _TENSOR in key:
                raise ValueError("save_checkpoint: тензор не может быть ключом словаря")
            items.append([key, _encode(v, f"{where}/{k}" if where else str(k), tensors)])
        return {_ITEMS: items}
    raise ValueError(
        f"save_checkpoint: значение типа {type(obj).__name__} в {where or 'состоянии'} не "
        f"сохраняется: допустимы тензоры, числа, строки, None, списки, кортежи и словари"
    )


def _decode(obj: Any, tensors: Mapping, path: Path, fname: str) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors, path, fname) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        ((key, value),) = obj.items()
        if key == _TENSOR:
            if value not in tensors:
                raise CheckpointError(
                    f"Контрольная точка {path}: файл {fname} ссылается на тензор {value!r}, "
                    f"которого нет в .safetensors",
                    path,
                    fname,
                )
            return tensors[value]
        if key == _TUPLE:
            return tuple(_decode(v, tensors, path, fname) for v in value)
        if key == _FLOAT:
            if value not in ("nan", "inf", "-inf"):
                raise CheckpointError(
                    f"Контрольная точка {path}: файл {fname}: неверная запись числа {value!r}",
                    path,
                    fname,
                )
            return float(value)
        if key == _ITEMS:
            out = {}
            for k, v in value:
                k = _decode(k, {}, path, fname)
                out[k] = _decode(v, tensors, path, fname)
            return out
    return {k: _decode(v, tensors, path, fname) for k, v in obj.items()}


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def config_hash(config: Any) -> str | None:
    """SHA-256 (hex) канонического JSON конфигурации (ключи по алфавиту); None для None."""
    if config is None:
        return None
    try:
        return hashlib.sha256(_canonical(config)).hexdigest()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config должно быть JSON-сериализуемым словарём: {exc}") from exc


# ----------------------------------------------------------------------------- запись


def _software() -> dict:
    import safetensors
    import torch

    from course_utils import __version__

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "course_utils": __version__,
    }


def _manifest_self_hash(manifest: Mapping) -> str:
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(_canonical(body)).hexdigest()


def _dir_kind(name: str) -> str:
    """Вид каталога в root по имени: KIND_TMP (".tmp-…"), KIND_OLD (".old-…") или KIND_MAIN."""
    if name.startswith(_TMP_PREFIX):
        return KIND_TMP
    if name.startswith(_OLD_PREFIX):
        return KIND_OLD
    return KIND_MAIN


def _publishable(name: Any) -> bool:
    """Имя, под которым контрольная точка лежит в root: не пустое, без "/" и не с точки."""
    return (
        isinstance(name, str)
        and bool(name)
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
    )


def _publish(src: Path, target: Path) -> None:
    """Ставит полную копию src на место target; в любой момент на диске есть полная копия.

    Если target уже есть: 1) target → ".old-<имя>-…" (полная, её находит latest_checkpoint),
    2) src → target, 3) удаление ".old-…". Убийство между шагами оставляет две полные копии
    или одну, не ноль; исключение на шаге 2 возвращает старую копию на место.
    """
    aside = None
    if target.exists():
        aside = target.with_name(f"{_OLD_PREFIX}{target.name}-{secrets.token_hex(4)}")
        while aside.exists():
            aside = target.with_name(f"{_OLD_PREFIX}{target.name}-{secrets.token_hex(4)}")
        os.replace(target, aside)
        atomic.fsync_dir(target.parent)
    try:
        os.replace(src, target)
    except BaseException:
        if aside is not None and not target.exists():
            os.replace(aside, target)
            atomic.fsync_dir(target.parent)
        raise
    atomic.fsync_dir(target.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)  # недоудалённую добьёт remove_incomplete


def save_checkpoint(
    state: Mapping,
    path: str | os.PathLike,
    config: Mapping | None = None,
    *,
    overwrite: bool = False,
    after_file: Callable[[str], None] | None = None,
) -> Path:
    """Атомарно пишет контрольную точку state (компонент → состояние) в каталог path; его Path.

    Временный каталог ".tmp-<имя>-…" рядом с path: <компонент>.safetensors (тензоры) и
    <компонент>.json (остальное), fsync каждого; manifest.json (размеры, SHA-256 файлов, хэш
    config, версии, шаг) последним; fsync каталога, переименование, fsync родителя. Сбой до
    manifest оставляет лишь временный каталог (его пропускает ``latest_checkpoint``).
    overwrite=True отодвигает прежнюю копию в ".old-…" и удаляет её, только когда новая на месте.
    after_file(имя) вызывается после каждого файла данных (для опытов с аварией).
    """
    import safetensors.torch

    target = _path("path", path)
    if not _publishable(target.name):
        raise ValueError(
            f"path: имя каталога {target.name!r} не годится — нужно непустое имя; имена с точки "
            f"в начале заняты временными каталогами ({_TMP_PREFIX}…, {_OLD_PREFIX}…). Например: "
            f"{checkpoint_name(0)!r}"
        )
    if not isinstance(state, Mapping) or not state:
        raise ValueError(f"state должно быть непустым словарём компонентов, получено {type(state)}")
    bad = [c for c in state if not isinstance(c, str) or not _COMPONENT_RE.match(c)]
    if bad or "manifest" in state:
        raise ValueError(
            f"state: имена компонентов — строчные латинские буквы, цифры и _, не 'manifest'; "
            f"получено {bad or ['manifest']}"
        )
    if config is not None and not isinstance(config, Mapping):
        raise ValueError(f"config должно быть словарём или None, получено {type(config)}")
    if after_file is not None and not callable(after_file):
        raise ValueError("after_file должно быть функцией или None")
    chash = config_hash(dict(config) if config is not None else None)
    if target.exists() and not overwrite:
        raise FileExistsError(
            f"Контрольная точка {target} уже существует; overwrite=True заменит её"
        )
    target.parent.mkdir(parents=True, exist_ok=True)

    # Кодируем всё до создания каталога: ошибка типа не оставит мусора.
    encoded: dict[str, tuple[bytes, bytes | None]] = {}
    for comp, value in state.items():
        tensors: dict = {}
        skeleton = _encode(value, "", tensors)
        js = json.dumps(skeleton, ensure_ascii=False, indent=1, allow_nan=False).encode()
        st = safetensors.torch.save(tensors) if tensors else None
        encoded[comp] = (js, st)

    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{target.name}-", dir=target.parent))
    try:
        files: dict[str, dict] = {}
        components: dict[str, list[str]] = {}
        for comp, (js, st) in encoded.items():
            names = []
            for fname, data in ((f"{comp}.safetensors", st), (f"{comp}.json", js)):
                if data is None:
                    continue
                atomic.write_synced(tmp / fname, data)
                files[fname] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                names.append(fname)
                if after_file is not None:
                    after_file(fname)
            components[comp] = names
        counters = state.get("counters")
        step = counters.get("global_step") if isinstance(counters, Mapping) else None
        versions = state.get("versions") if isinstance(state.get("versions"), Mapping) else {}
        if isinstance(counters, Mapping) and "policy_version" in counters:
            versions = {"policy_version": counters["policy_version"], **versions}
        now = time.time()
        manifest = {
            "format": FORMAT,
            "name": target.name,
            "step": step,
            "created_unix": now,
            "created_utc": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(),
            "config": dict(config) if config is not None else None,
            "config_sha256": chash,
            "versions": json.loads(json.dumps(_encode(versions, "", {}))),
            "software": _software(),
            "components": components,
            "files": files,
            "total_bytes": sum(f["bytes"] for f in files.values()),
        }
        manifest["manifest_sha256"] = _manifest_self_hash(manifest)
        atomic.write_synced(
            tmp / MANIFEST, json.dumps(manifest, ensure_ascii=False, indent=1).encode()
        )
        atomic.fsync_dir(tmp)
        _publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


# ----------------------------------------------------------------------------- чтение


def _fail(path: Path, text: str, file: str = "") -> CheckpointError:
    return CheckpointError(f"Контрольная точка {path}: {text}", path, file)


def _required(components: Any) -> tuple[str, ...] | None:
    """Аргумент components: None (любой набор) или имена обязательных компонентов."""
    if components is None:
        return None
    names = (
        tuple(components)
        if isinstance(components, Iterable) and not isinstance(components, str | bytes)
        else None
    )
    if names is None or not all(isinstance(c, str) for c in names):
        raise ValueError(
            f"components должно быть набором имён компонентов (строк) или None, "
            f"получено {components!r}"
        )
    return names


def _read_manifest(path: Path) -> dict:
    if not path.is_dir():
        raise _fail(path, "каталога нет или это не каталог")
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise _fail(
            path,
            f"нет файла {MANIFEST}: запись не завершена (manifest пишется последним) или это не "
            f"контрольная точка",
            MANIFEST,
        )
    try:
        manifest = json.loads(mpath.read_bytes().decode("utf-8"))
    except OSError as exc:  # каталог удалили между проверкой и чтением
        raise _fail(path, f"файл {MANIFEST} не читается: {exc}", MANIFEST) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(path, f"файл {MANIFEST} повреждён: это не JSON ({exc})", MANIFEST) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise _fail(
            path, f"файл {MANIFEST}: неизвестный формат {got!r}, ожидался {FORMAT!r}", MANIFEST
        )
    if manifest.get("manifest_sha256") != _manifest_self_hash(manifest):
        raise _fail(path, f"файл {MANIFEST} изменён: его собственная SHA-256 не сходится", MANIFEST)
    files, comps = manifest.get("files"), manifest.get("components")
    if not isinstance(files, dict) or not isinstance(comps, dict):
        raise _fail(path, f"файл {MANIFEST}: нет списков files и components", MANIFEST)
    for fname, meta in files.items():
        meta = meta if isinstance(meta, dict) else {}
        if not is_int(meta.get("bytes")) or not isinstance(meta.get("sha256"), str):
            raise _fail(path, f"файл {MANIFEST}: для {fname} нет размера и SHA-256", MANIFEST)
    for comp, names in comps.items():
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _fail(path, f"файл {MANIFEST}: у компонента {comp} нет списка файлов", MANIFEST)
        for fname in (n for n in names if n not in files):
            msg = f"компонент {comp} ссылается на {fname}, которого нет в files"
            raise _fail(path, f"файл {MANIFEST}: {msg}", MANIFEST)
    for fname in files:
        if "/" in fname or "\\" in fname or fname.startswith(".") or fname == MANIFEST:
            raise _fail(path, f"файл {MANIFEST}: недопустимое имя файла {fname!r}", MANIFEST)
    return manifest


def _check_config(path: Path, manifest: Mapping, config: Mapping | None) -> None:
    if config is None:
        return
    if not isinstance(config, Mapping):
        raise ValueError(f"config должно быть словарём или None, получено {type(config)}")
    if config_hash(dict(config)) == manifest.get("config_sha256"):
        return
    saved = manifest.get("config") or {}
    diffs = [
        f"{k}: {saved.get(k, '—')!r} → {config.get(k, '—')!r}"
        for k in sorted(set(saved) | set(config), key=str)
        if saved.get(k, "—") != config.get(k, "—")
    ]
    detail = "; ".join(diffs) if diffs else "хэш не совпадает"
    raise _fail(
        path,
        f"конфигурация запуска не совпадает с записанной в {MANIFEST} (было → сейчас): {detail}",
        MANIFEST,
    )


def _check_components(path: Path, manifest: Mapping, components: tuple[str, ...] | None) -> None:
    missing = [c for c in components or () if c not in manifest["components"]]
    if missing:
        raise _fail(
            path,
            f"в {MANIFEST} нет компонентов: {', '.join(missing)} — состояние неполное, честное "
            f"продолжение невозможно",
            MANIFEST,
        )


def _read_verified(
    path: Path, config: Mapping | None, components: tuple[str, ...] | None = None
) -> tuple[dict, dict[str, bytes]]:
    manifest = _read_manifest(path)
    _check_config(path, manifest, config)
    _check_components(path, manifest, components)
    blobs: dict[str, bytes] = {}
    for fname, meta in manifest["files"].items():
        fpath = path / fname
        if not fpath.is_file():
            raise _fail(path, f"нет файла {fname}, указанного в {MANIFEST}", fname)
        try:
            data = fpath.read_bytes()
        except OSError as exc:
            raise _fail(path, f"файл {fname} не читается: {exc}", fname) from None
        if len(data) != meta.get("bytes"):
            what = "обрезан" if len(data) < meta.get("bytes", 0) else "длиннее записанного"
            raise _fail(
                path,
                f"файл {fname} {what}: {len(data)} Б вместо {meta.get('bytes')} Б по {MANIFEST}",
                fname,
            )
        if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            raise _fail(
                path,
                f"файл {fname}: SHA-256 не совпадает с {MANIFEST} — файл изменён или повреждён",
                fname,
            )
        blobs[fname] = data
    return manifest, blobs


def _load_state(
    path: Path, config: Mapping | None, components: tuple[str, ...] | None
) -> tuple[dict, dict[str, Any]]:
    """Всё, что проверяет load_checkpoint, и разобранное состояние: (manifest, state)."""
    import safetensors.torch

    manifest, blobs = _read_verified(path, config, components)
    state: dict[str, Any] = {}
    for comp, names in manifest["components"].items():
        tensors: dict = {}
        skeleton: Any = None
        for fname in names:
            try:
                if fname.endswith(".safetensors"):
                    tensors = safetensors.torch.load(blobs[fname])
                elif fname.endswith(".json"):
                    skeleton = json.loads(blobs[fname].decode("utf-8"))
            except Exception as exc:
                raise _fail(
                    path, f"файл {fname} не читается: {type(exc).__name__}: {exc}", fname
                ) from None
        if skeleton is None:
            raise _fail(path, f"у компонента {comp} нет файла {comp}.json", MANIFEST)
        try:
            state[comp] = _decode(skeleton, tensors, path, f"{comp}.json")
        except CheckpointError:
            raise
        except (TypeError, ValueError) as exc:
            raise _fail(
                path, f"файл {comp}.json: неверная структура ({exc})", f"{comp}.json"
            ) from None
    return manifest, state


def verify_checkpoint(
    path: str | os.PathLike,
    config: Mapping | None = None,
    *,
    components: Iterable[str] | None = None,
) -> dict:
    """Проверяет каталог контрольной точки и возвращает её manifest; иначе CheckpointError.

    Проверяет ровно то же, что ``load_checkpoint`` (проходит одна — пройдёт и другая):
    manifest.json есть, это JSON нашего формата и его собственная SHA-256 сходится; каждый
    файл из manifest есть, его размер (байты) и SHA-256 совпадают, JSON и safetensors
    разбираются, ссылки на тензоры целы; если задан config — его хэш совпадает с записанным
    (в сообщении — какие ключи различаются); если заданы components — все они есть.
    """
    manifest, _ = _load_state(_path("path", path), config, _required(components))
    return manifest


def read_manifest(path: str | os.PathLike) -> dict:
    """manifest.json контрольной точки (без проверки файлов данных); CheckpointError, если его нет."""
    return _read_manifest(_path("path", path))


def load_checkpoint(
    path: str | os.PathLike,
    config: Mapping | None = None,
    *,
    components: Iterable[str] | None = None,
) -> dict:
    """Читает проверенную контрольную точку: словарь компонент → состояние (как в save_checkpoint).

    Проверки — как у ``verify_checkpoint`` (размеры, SHA-256, config), разбор — из уже
    проверенных байтов. components — обязательные компоненты (например ``COMPONENTS`` для
    полного восстановления ToyRLRun): если какого-то нет в manifest — CheckpointError, а не
    неполное состояние. pickle и torch.load не используются: произвольные объекты из файла не
    создаются. Весь каталог читается в память — для учебных размеров.
    """
    _, state = _load_state(_path("path", path), config, _required(components))
    return state


def _created(manifest: Mapping) -> float:
    created = manifest.get("created_unix")
    return float(created) if is_real(created) else 0.0


def _order_key(entry: Path, manifest: Mapping | None) -> tuple[int, bool, float, str]:
    """Ключ новизны: (шаг, основной ли каталог, время создания, имя); больше — новее.

    Шаг — из manifest; если там его нет — из имени "step-NNNNNN" (каталога или записанного в
    manifest), иначе −1. При равном шаге основной каталог идёт раньше копий ".tmp-…"/".old-…".
    """
    manifest = manifest or {}
    step = manifest.get("step")
    if not is_int(step):
        m = _NAME_RE.match(entry.name) or _NAME_RE.match(str(manifest.get("name", "")))
        step = int(m.group(1)) if m else -1
    return int(step), _dir_kind(entry.name) == KIND_MAIN, _created(manifest), entry.name


def _candidates(root: Path) -> list[Path]:
    """Подкаталоги root с читаемым manifest.json, от новых к старым (ключ ``_order_key``)."""
    found = []
    if root.is_dir():
        for entry in root.iterdir():
            if not entry.is_dir():
                continue
            try:
                manifest = _read_manifest(entry)
            except CheckpointError:
                continue
            found.append((_order_key(entry, manifest), entry))
    return [entry for _, entry in sorted(found, key=lambda x: x[0], reverse=True)]


_UNFINISHED = {
    KIND_TMP: "временный каталог: запись не завершена",
    KIND_OLD: "старая копия, отодвинутая при замене: удалена не до конца",
}


def scan_checkpoints(
    root: str | os.PathLike,
    config: Mapping | None = None,
    *,
    components: Iterable[str] | None = None,
):
    """Таблица pandas каталогов контрольных точек в root, новые сверху (порядок latest_checkpoint).

    Столбцы: name, step, ok (примет ли load_checkpoint), problem (по-русски), total_bytes (Б по
    manifest), kind (основной, временный, старая копия), created_utc. Первая строка с ok — то,
    что вернёт ``latest_checkpoint``; у непроверенных временных каталогов step пуст.
    """
    import pandas as pd

    root = _path("root", root)
    components = _required(components)
    rows = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        kind = _dir_kind(entry.name)
        if not entry.is_dir() or (
            kind == KIND_MAIN and not _NAME_RE.match(entry.name) and not (entry / MANIFEST).exists()
        ):
            continue
        manifest, ok, problem = None, True, ""
        try:
            manifest, _ = _load_state(entry, config, components)
        except CheckpointError as exc:
            ok, problem = False, str(exc)
            with contextlib.suppress(CheckpointError):
                manifest = _read_manifest(entry) if kind == KIND_MAIN else None
        if not ok and kind != KIND_MAIN:
            problem = f"{_UNFINISHED[kind]} — {problem}"
        key = _order_key(entry, manifest)
        rows.append(
            {
                "name": entry.name,
                "step": key[0] if key[0] >= 0 and (ok or kind == KIND_MAIN) else None,
                "ok": ok,
                "problem": problem,
                "total_bytes": manifest.get("total_bytes") if ok else None,
                "kind": kind,
                "created_utc": manifest.get("created_utc") if manifest else None,
                "_key": key if ok or kind == KIND_MAIN else (-1, False, 0.0, entry.name),
            }
        )
    rows.sort(key=lambda r: r["_key"], reverse=True)
    columns = ["name", "step", "ok", "problem", "total_bytes", "kind", "created_utc"]
    frame = pd.DataFrame([{k: r[k] for k in columns} for r in rows], columns=columns)
    return frame.astype({"step": "Int64", "total_bytes": "Int64"})


def latest_checkpoint(
    root: str | os.PathLike,
    config: Mapping | None = None,
    *,
    components: Iterable[str] | None = None,
) -> Path | None:
    """Самая новая контрольная точка в root, которую примет ``load_checkpoint``; иначе None.

    Кандидаты — подкаталоги с manifest.json под любым именем, включая полные копии ".tmp-…" и
    ".old-…" от записи, убитой посреди замены. Новизна — по шагу в manifest, при равном шаге
    основной каталог раньше копий. Негодные пропускаются: откат к предыдущей годной точке.
    """
    root = _path("root", root)
    components = _required(components)
    for entry in _candidates(root):
        try:
            _load_state(entry, config, components)
        except CheckpointError:
            continue
        return entry
    return None


def _remove(entry: Path, removed: list[str]) -> None:
    shutil.rmtree(entry, ignore_errors=True)
    removed.append(entry.name)


def remove_incomplete(root: str | os.PathLike) -> list[str]:
    """Доводит до конца прерванные записи в root; возвращает имена удалённых каталогов.

    Непроверяемый ".tmp-…"/".old-…" удаляется; самая новая полная копия под своим именем встаёт
    на место (root/имя) той же заменой, что в save_checkpoint, старшие копии удаляются — как
    после завершённой записи с overwrite=True. Только когда в root не пишет другой процесс.
    """
    root = _path("root", root)
    removed: list[str] = []
    copies: dict[str, list[tuple[float, Path]]] = {}
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if not entry.is_dir() or _dir_kind(entry.name) == KIND_MAIN:
            continue
        try:
            manifest = verify_checkpoint(entry)
        except CheckpointError:
            _remove(entry, removed)
            continue
        if _publishable(manifest.get("name")):  # иначе не трогаем: её найдёт latest_checkpoint
            copies.setdefault(manifest["name"], []).append((_created(manifest), entry))
    for name, found in sorted(copies.items()):
        found.sort()
        (created, newest), older = found[-1], found[:-1]
        target = root / name
        try:
            current = _created(verify_checkpoint(target))
        except CheckpointError:
            current = None  # под именем ничего нет или копия там не полная
        if current is None or current < created:
            _publish(newest, target)
        else:
            older.append((created, newest))
        for _, entry in older:
            _remove(entry, removed)
    return removed


# ----------------------------------------------------------------------------- восстановление


def resume_full(
    run_factory: Callable[[], ToyRLRun], checkpoint_path: str | os.PathLike
) -> ToyRLRun:
    """Честное восстановление: свежий запуск из run_factory() и всё его состояние из контрольной точки."""
    run = run_factory()
    run.load_state_dict(load_checkpoint(checkpoint_path, config=run.config, components=COMPONENTS))
    return run


def resume_weights_only(
    run_factory: Callable[[], ToyRLRun], checkpoint_path: str | os.PathLike
) -> ToyRLRun:
    """Нечестное восстановление: только веса политики, шаг и версия — из manifest (журнал
    сравним по шагам); оптимизатор, ГСЧ, курсор, программа, очередь и прочее — свежие."""
    run = run_factory()
    state = load_checkpoint(checkpoint_path, config=run.config, components=("policy",))
    run.load_weights_only(state)
    step = read_manifest(checkpoint_path).get("step") or 0
    run.global_step = run.policy_version = int(step)
    return run


def remove_checkpoints(root: str | os.PathLike) -> None:
    """Удаляет из root все контрольные точки: полные (каталоги с manifest.json или step-…),
    недописанные ".tmp-…" и отодвинутые ".old-…"; прочие каталоги и файлы не трогает."""
    for old in _path("root", root).iterdir():
        if old.is_dir() and (
            _NAME_RE.match(old.name)
            or _dir_kind(old.name) != KIND_MAIN
            or (old / MANIFEST).exists()
        ):
            shutil.rmtree(old)
