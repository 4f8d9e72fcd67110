"""Урок 12.5: формат полной контрольной точки RL-запуска — запись, чтение, проверка, поиск.

Читается сверху вниз: словарь компонентов ``COMPONENTS`` → кодирование состояния (тензоры в
safetensors, остальное в JSON) → ``save_checkpoint`` (временный каталог, fsync, ``manifest.json``
с SHA-256 последним, переименование) → ``load_checkpoint`` / ``verify_checkpoint`` (размеры,
SHA-256, конфигурация; ``CheckpointError``) → ``latest_checkpoint`` / ``remove_incomplete`` →
``resume_full`` и ``resume_weights_only``. Чего здесь нет: шардирования по рангам, асинхронной
записи и pickle (произвольные объекты из файла не создаются). torch, safetensors и pandas
загружаются лениво.
"""

from __future__ import annotations

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
from course_utils.args import integer, is_int, is_real, path as _path
from course_utils.csv_tables import DATA_DIR

if TYPE_CHECKING:
    from course_utils.toy_run import ToyRLRun

_FORMAT = "course_utils.checkpoint/1"
MANIFEST = "manifest.json"
EVENTS_FILE = "events.jsonl"

_NAME_RE = re.compile(r"^step-(\d{6,})$")
_TMP_PREFIX = ".tmp-"  # запись идёт (или прервана): файлы данных, manifest последним
_OLD_PREFIX = ".old-"  # прежняя копия, отодвинутая при overwrite=True до переименования новой
_COMPONENT_RE = re.compile(r"^[a-z][a-z0-9_]*$")

# Компонент состояния ToyRLRun → (что в нём, что ломается без него); порядок — порядок записи:
# policy, optimizer, scheduler, counters, rng, data_cursor, curriculum, normalizer, versions, queue.
_COMPONENTS_FILE = DATA_DIR / "checkpoint_components.json"
COMPONENTS: dict[str, tuple[str, str]] = {
    name: (row["что в нём"], row["что ломается без него"])
    for name, row in json.loads(_COMPONENTS_FILE.read_text(encoding="utf-8")).items()
}


def components_frame():
    """Таблица pandas ``COMPONENTS``: «компонент», «что в нём», «что ломается без него»."""
    import pandas as pd

    rows = [(name, *what) for name, what in COMPONENTS.items()]
    return pd.DataFrame(rows, columns=["компонент", "что в нём", "что ломается без него"])


class CheckpointError(ValueError):
    """Контрольная точка не проходит проверку: нет файла, файл обрезан или изменён и т. п."""

    def __init__(self, message: str, file: str = ""):
        super().__init__(message)
        self.file = file  # файл, не прошедший проверку ("" — каталог в целом)


def checkpoint_name(step: int) -> str:
    """Имя каталога контрольной точки шага step: "step-000012" (шесть и более цифр)."""
    return f"step-{integer('step', step, 0):06d}"


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
        items = []  # ключи не строки (состояние оптимизатора: {0: ...}) — список пар
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


def _decode(obj: Any, tensors: Mapping) -> Any:
    """JSON-скелет и тензоры → состояние (обратное ``_encode``); KeyError — нет тензора."""
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        ((key, value),) = obj.items()
        if key == _TENSOR:
            return tensors[value]
        if key == _TUPLE:
            return tuple(_decode(v, tensors) for v in value)
        if key == _FLOAT:
            return float(value)
        if key == _ITEMS:
            return {_decode(k, {}): _decode(v, tensors) for k, v in value}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def _config_hash(config: Mapping) -> str:
    """SHA-256 (hex) канонического JSON конфигурации (ключи по алфавиту)."""
    try:
        return hashlib.sha256(_canonical(dict(config))).hexdigest()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config должно быть JSON-сериализуемым словарём: {exc}") from exc


def _manifest_self_hash(manifest: Mapping) -> str:
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(_canonical(body)).hexdigest()


# ----------------------------------------------------------------------------- запись


def _publishable(name: Any) -> bool:
    """Имя, под которым контрольная точка лежит в root: не пустое, без "/" и не с точки."""
    return isinstance(name, str) and bool(name) and name[0] != "." and not set(name) & {"/", "\\"}


def _is_copy(name: str) -> bool:
    """Каталог ".tmp-…" (запись не завершена) или ".old-…" (прежняя копия при замене)."""
    return name.startswith((_TMP_PREFIX, _OLD_PREFIX))


def publish_dir(src: Path, target: Path) -> None:
    """Ставит полную копию src на место target; в любой момент на диске есть полная копия.

    Если target уже есть: 1) target → ".old-<имя>-…" (полная, её находит latest_checkpoint),
    2) src → target, 3) удаление ".old-…". Убийство между шагами оставляет две полные копии
    или одну, не ноль; исключение на шаге 2 возвращает старую копию на место.
    """
    aside = None
    if target.exists():
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
    import torch

    from course_utils import __version__

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
    chash = _config_hash(config) if config is not None else None
    if target.exists() and not overwrite:
        raise FileExistsError(
            f"Контрольная точка {target} уже существует; overwrite=True заменит её"
        )
    target.parent.mkdir(parents=True, exist_ok=True)

    # Кодируем всё до создания каталога: ошибка типа не оставит мусора.
    blobs: dict[str, bytes] = {}  # имя файла → байты, в порядке записи
    components: dict[str, list[str]] = {}
    for comp, value in state.items():
        tensors: dict = {}
        skeleton = _encode(value, "", tensors)
        if tensors:
            blobs[f"{comp}.safetensors"] = safetensors.torch.save(tensors)
        js = json.dumps(skeleton, ensure_ascii=False, indent=1, allow_nan=False).encode()
        blobs[f"{comp}.json"] = js
        components[comp] = [f for f in blobs if f.startswith(f"{comp}.")]  # имена без точек
    files = {
        f: {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()} for f, b in blobs.items()
    }

    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{target.name}-", dir=target.parent))
    try:
        for fname, data in blobs.items():
            atomic.write_synced(tmp / fname, data)
            if after_file is not None:
                after_file(fname)
        counters = state.get("counters")
        counters = counters if isinstance(counters, Mapping) else {}
        versions = state.get("versions") if isinstance(state.get("versions"), Mapping) else {}
        if "policy_version" in counters:
            versions = {"policy_version": counters["policy_version"], **versions}
        now = time.time()
        manifest = {
            "format": _FORMAT,
            "name": target.name,
            "step": counters.get("global_step"),
            "created_unix": now,
            "created_utc": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(),
            "config": dict(config) if config is not None else None,
            "config_sha256": chash,
            "versions": _encode(versions, "", {}),
            "software": {
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "safetensors": safetensors.__version__,
                "numpy": np.__version__,
                "course_utils": __version__,
            },
            "components": components,
            "files": files,
            "total_bytes": sum(f["bytes"] for f in files.values()),
        }
        manifest["manifest_sha256"] = _manifest_self_hash(manifest)
        atomic.write_synced(
            tmp / MANIFEST, json.dumps(manifest, ensure_ascii=False, indent=1).encode()
        )
        atomic.fsync_dir(tmp)
        publish_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


# ----------------------------------------------------------------------------- чтение и проверка


def _fail(path: Path, text: str, file: str = "") -> CheckpointError:
    return CheckpointError(f"Контрольная точка {path}: {text}", file)


def _required(components: Iterable[str] | None) -> tuple[str, ...] | None:
    """Аргумент components: None (любой набор) или имена обязательных компонентов."""
    if isinstance(components, str | bytes):
        raise ValueError(f"components должно быть набором имён, а не строкой: {components!r}")
    return None if components is None else tuple(components)


def _well_formed(manifest: dict) -> bool:
    """В manifest есть files (имя → bytes, sha256) и components (имя → список имён из files)."""
    files, comps = manifest.get("files"), manifest.get("components")
    if not isinstance(files, dict) or not isinstance(comps, dict):
        return False
    for fname, meta in files.items():
        if not _publishable(fname) or fname == MANIFEST or not isinstance(meta, dict):
            return False
        if not is_int(meta.get("bytes")) or not isinstance(meta.get("sha256"), str):
            return False
    return all(
        isinstance(names, list) and all(isinstance(n, str) and n in files for n in names)
        for names in comps.values()
    )


def read_manifest(path: str | os.PathLike) -> dict:
    """manifest.json контрольной точки (без проверки файлов данных): наш формат, собственная
    SHA-256 сходится, списки целы; иначе CheckpointError."""
    path = _path("path", path)
    if not path.is_dir():
        raise _fail(path, "каталога нет или это не каталог")
    if not (path / MANIFEST).is_file():
        raise _fail(
            path,
            f"нет файла {MANIFEST}: запись не завершена (manifest пишется последним) или это не "
            f"контрольная точка",
            MANIFEST,
        )
    try:
        manifest = json.loads((path / MANIFEST).read_bytes().decode("utf-8"))
    except OSError as exc:  # каталог удалили между проверкой и чтением
        raise _fail(path, f"файл {MANIFEST} не читается: {exc}", MANIFEST) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(path, f"файл {MANIFEST} повреждён: это не JSON ({exc})", MANIFEST) from None
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise _fail(
            path, f"файл {MANIFEST}: неизвестный формат {got!r}, ожидался {_FORMAT!r}", MANIFEST
        )
    if manifest.get("manifest_sha256") != _manifest_self_hash(manifest):
        raise _fail(path, f"файл {MANIFEST} изменён: его собственная SHA-256 не сходится", MANIFEST)
    if not _well_formed(manifest):
        raise _fail(path, f"файл {MANIFEST}: неверные списки files и components", MANIFEST)
    return manifest


def _check_config(path: Path, manifest: Mapping, config: Mapping | None) -> None:
    """Хэш config совпадает с записанным; иначе CheckpointError со списком различий."""
    if config is None:
        return
    if not isinstance(config, Mapping):
        raise ValueError(f"config должно быть словарём или None, получено {type(config)}")
    if _config_hash(config) == manifest.get("config_sha256"):
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


def _read_file(path: Path, fname: str, meta: Mapping) -> bytes:
    """Байты файла fname; его размер и SHA-256 — как в manifest, иначе CheckpointError."""
    if not (path / fname).is_file():
        raise _fail(path, f"нет файла {fname}, указанного в {MANIFEST}", fname)
    try:
        data = (path / fname).read_bytes()
    except OSError as exc:
        raise _fail(path, f"файл {fname} не читается: {exc}", fname) from None
    if len(data) != meta["bytes"]:
        what = "обрезан" if len(data) < meta["bytes"] else "длиннее записанного"
        msg = f"файл {fname} {what}: {len(data)} Б вместо {meta['bytes']} Б по {MANIFEST}"
        raise _fail(path, msg, fname)
    if hashlib.sha256(data).hexdigest() != meta["sha256"]:
        msg = f"файл {fname}: SHA-256 не совпадает с {MANIFEST} — файл изменён или повреждён"
        raise _fail(path, msg, fname)
    return data


def _load_state(
    path: Path, config: Mapping | None, components: tuple[str, ...] | None
) -> tuple[dict, dict[str, Any]]:
    """Всё, что проверяет load_checkpoint, и разобранное состояние: (manifest, state)."""
    import safetensors.torch

    manifest = read_manifest(path)
    _check_config(path, manifest, config)
    missing = [c for c in components or () if c not in manifest["components"]]
    if missing:
        msg = f"в {MANIFEST} нет компонентов: {', '.join(missing)} — состояние неполное, честное "
        raise _fail(path, msg + "продолжение невозможно", MANIFEST)
    blobs = {f: _read_file(path, f, meta) for f, meta in manifest["files"].items()}
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
                msg = f"файл {fname} не читается: {type(exc).__name__}: {exc}"
                raise _fail(path, msg, fname) from None
        if skeleton is None:
            raise _fail(path, f"у компонента {comp} нет файла {comp}.json", MANIFEST)
        try:
            state[comp] = _decode(skeleton, tensors)
        except KeyError as exc:
            msg = f"файл {comp}.json ссылается на тензор {exc.args[0]!r}, которого нет"
            raise _fail(path, msg, f"{comp}.json") from None
        except (TypeError, ValueError) as exc:
            msg = f"файл {comp}.json: неверная структура ({exc})"
            raise _fail(path, msg, f"{comp}.json") from None
    return manifest, state


def load_checkpoint(
    path: str | os.PathLike,
    config: Mapping | None = None,
    *,
    components: Iterable[str] | None = None,
) -> dict:
    """Читает проверенную контрольную точку: словарь компонент → состояние (как в save_checkpoint).

    Проверяет: manifest.json нашего формата и его SHA-256; размер (Б) и SHA-256 каждого файла;
    config — хэш совпадает с записанным (в сообщении — какие ключи различаются); components —
    все обязательные есть (например ``COMPONENTS`` для полного восстановления ToyRLRun), иначе
    CheckpointError, а не неполное состояние. Весь каталог читается в память — учебные размеры.
    """
    return _load_state(_path("path", path), config, _required(components))[1]


def verify_checkpoint(
    path: str | os.PathLike,
    config: Mapping | None = None,
    *,
    components: Iterable[str] | None = None,
) -> dict:
    """Проверяет ровно то же, что ``load_checkpoint``, и возвращает manifest; иначе CheckpointError."""
    return _load_state(_path("path", path), config, _required(components))[0]


# ----------------------------------------------------------------------------- поиск


def _created(manifest: Mapping) -> float:
    created = manifest.get("created_unix")
    return float(created) if is_real(created) else 0.0


def _order_key(entry: Path, manifest: Mapping) -> tuple[int, bool, float, str]:
    """Ключ новизны (больше — новее): шаг (из manifest, иначе из имени "step-NNNNNN", иначе −1),
    основной каталог, а не копия ".tmp-…"/".old-…", время создания, имя."""
    step = manifest.get("step")
    if not is_int(step):
        m = _NAME_RE.match(entry.name) or _NAME_RE.match(str(manifest.get("name", "")))
        step = int(m.group(1)) if m else -1
    return int(step), not _is_copy(entry.name), _created(manifest), entry.name


def latest_checkpoint(
    root: str | os.PathLike,
    config: Mapping | None = None,
    *,
    components: Iterable[str] | None = None,
) -> Path | None:
    """Самая новая контрольная точка в root, которую примет ``load_checkpoint``; иначе None.

    Кандидаты — подкаталоги с manifest.json под любым именем, включая полные копии ".tmp-…" и
    ".old-…" от записи, убитой посреди замены; по шагу, затем основной каталог раньше копии.
    Негодные пропускаются: откат к предыдущей годной точке.
    """
    root = _path("root", root)
    components = _required(components)
    found = []
    for entry in root.iterdir() if root.is_dir() else ():
        try:
            found.append((_order_key(entry, read_manifest(entry)), entry))
        except CheckpointError:
            continue
    for _, entry in sorted(found, reverse=True):
        try:
            _load_state(entry, config, components)
        except CheckpointError:
            continue
        return entry
    return None


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
        if not entry.is_dir() or not _is_copy(entry.name):
            continue
        try:
            manifest = verify_checkpoint(entry)
        except CheckpointError:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
            continue
        if _publishable(manifest.get("name")):  # иначе не трогаем: её найдёт latest_checkpoint
            copies.setdefault(manifest["name"], []).append((_created(manifest), entry))
    for name, found in sorted(copies.items()):
        *older, (created, newest) = sorted(found)
        try:
            current = _created(verify_checkpoint(root / name))
        except CheckpointError:
            current = None  # под именем ничего нет или копия там не полная
        if current is None or current < created:
            publish_dir(newest, root / name)
        else:
            older.append((created, newest))
        for _, entry in older:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


def remove_checkpoints(root: str | os.PathLike) -> None:
    """Удаляет из root все контрольные точки: полные (каталоги с manifest.json или step-…),
    недописанные ".tmp-…" и отодвинутые ".old-…"; прочие каталоги и файлы не трогает."""
    for old in _path("root", root).iterdir():
        if old.is_dir() and (
            _NAME_RE.match(old.name) or _is_copy(old.name) or (old / MANIFEST).exists()
        ):
            shutil.rmtree(old)


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
