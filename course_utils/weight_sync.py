"""Урок 12.4, шаг 12.4.5: версионированная атомарная публикация весов движкам генерации.

``transfer_weights`` — единственный перенос весов (в процессе, broadcast, send/recv).
``InProcessEngine`` — два буфера весов: запросы читают активный, версия пишется в подготовительный,
``commit`` меняет указатель. ``publish``: запись → проверка (SHA-256, логиты) → ready → барьер →
commit всех, одна неудача — abort везде; ``atomic=False`` — запись на месте (смесь версий).
События — ``EventLog`` (схема ``EVENT_FIELDS``), аудит — ``weight_audit``.
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist

from course_utils.args import choice, flag, integer, nonnegative, real, text
from course_utils.csv_tables import DATA_DIR, read_exact_csv
from course_utils.fmt import num
from course_utils.multiproc.transport import named_tensors, state_checksum

# Допуск max |Δ логита|: один тип и одно устройство дают побитное совпадение; допуск — для bf16.
DEFAULT_ATOL = 1e-4

# Русские подписи (data/weight_sync_labels.csv): схема журнала — поля EVENT_FIELDS и типы
# событий EVENT_TYPES; заголовки таблиц для показа COLUMN_NAMES (``russian``); правила аудита.
_LABELS = read_exact_csv(
    DATA_DIR / "weight_sync_labels.csv", ("table", "name", "label"), "подписи синхронизации весов"
)


def sync_labels(table: str) -> dict[str, str]:
    """Подписи одной таблицы ``data/weight_sync_labels.csv``: код → русский текст."""
    return {row["name"]: row["label"] for _, row in _LABELS if row["table"] == table}


EVENT_FIELDS, EVENT_TYPES = sync_labels("field"), sync_labels("event")
COLUMN_NAMES = sync_labels("column")
_REQUEST_COLUMNS = ["request_id", "replica", "served_version", "matches_old", "matches_new"]
_REQUEST_COLUMNS += ["read_consistent", "torn", "outcome"]
_OPTIONAL_FIELDS = ("checksum", "expected_checksum", "request_id", "buffer", "detail")


def short_checksum(checksum: Any) -> str:
    """Первые 10 знаков суммы и «…» — для сообщений."""
    long = isinstance(checksum, str) and len(checksum) > 10
    return f"{checksum[:10]}…" if long else str(checksum)


def transfer_weights(src: Any, dst: Any, link: Any = "copy", *, device=None, dtype=None):
    """Переносит именованные тензоры src → dst по одному; yield имени, когда тензор на месте.

    link: "copy" — ``dst[n].copy_(src[n])`` с приведением типа; ("broadcast", root) — ранг root
    шлёт src, остальные принимают в dst; ("send", peer) — src рангу peer (на device, в dtype);
    ("recv", peer) — в буферы dst. Байт на тензор: numel · element_size (типа на проводе).
    """
    kind, peer = (link, None) if isinstance(link, str) else link
    choice("link", kind, ("copy", "broadcast", "send", "recv"))
    peer = None if kind == "copy" else integer("link[1] (ранг)", peer, 0)
    sender = kind == "send" or (kind == "broadcast" and dist.get_rank() == peer)
    for name, t in (src if sender else dst).items():
        with torch.no_grad():  # не держим no_grad через yield: он глобален для потока
            if kind == "copy":
                if name not in src:
                    raise ValueError(f"src: нет тензора {name}, который ждёт dst")
                t.copy_(src[name])  # приведение к типу и устройству dst
            elif kind == "broadcast":
                dist.broadcast(t, src=peer)
            elif kind == "send":
                wire = t.detach().to(device or t.device, dtype or t.dtype)
                dist.send(wire.contiguous(), dst=peer)
            else:
                dist.recv(t, src=peer)
        yield name


class EventLog:
    """Журнал публикации: события-словари со схемой ``EVENT_FIELDS``; t = clock() − t0, с."""

    def __init__(self, clock: Callable[[], float] | None = None, t0: float | None = None) -> None:
        self._clock = clock or time.perf_counter
        self._t0 = self._clock() if t0 is None else real("t0", t0)
        self._events: list[dict] = []
        self._lock = threading.Lock()

    def add(self, event: str, replica: str, version: int, **fields: Any) -> dict:
        """Добавляет событие event реплики replica о версии version; seq и t — сами."""
        choice("event", event, EVENT_TYPES)
        row = {"replica": text("replica", replica), "event": event}
        row["version"] = integer("version", version, 0)
        for key in fields:
            choice("поле события", key, _OPTIONAL_FIELDS)
        row |= {k: None for k in _OPTIONAL_FIELDS} | {"detail": ""} | fields
        with self._lock:
            row = {"seq": len(self._events), "t": self._clock() - self._t0} | row
            self._events.append(row)
        return row

    def __iter__(self) -> Iterator[dict]:
        return iter(list(self._events))

    def to_list(self) -> list[dict]:
        """Копия событий: список словарей (JSON-сериализуемый)."""
        return [dict(e) for e in self._events]

    def frame(self):
        """Таблица pandas: строка на событие, столбцы — ``EVENT_FIELDS``."""
        return pd.DataFrame(self.to_list(), columns=list(EVENT_FIELDS))


# ----------------------------------------------------------------------------- помощники модели


def _decoder_layers(model) -> list[torch.nn.Module]:
    """Слои для вклинивания между ними: блоки декодера и выходной слой."""
    return [*model.get_decoder().layers, model.get_output_embeddings()]


def _check_input_ids(input_ids: Any, vocab: int, name: str = "input_ids") -> torch.Tensor:
    if not torch.is_tensor(input_ids) or input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} должно быть тензором целых (int64), получено {type(input_ids)}")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.dim() != 2 or input_ids.numel() == 0:
        shape = tuple(input_ids.shape)
        raise ValueError(f"{name}: нужна непустая матрица [пакет, длина], форма {shape}")
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise ValueError(f"{name}: номера токенов должны лежать в [0, {vocab - 1}]")
    return input_ids.long()


@torch.no_grad()
def _logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    device = next(model.parameters()).device
    return model(input_ids.to(device), use_cache=False).logits.detach()


def probe_input(model: Any, batch: int = 2, length: int = 12, seed: int = 0) -> torch.Tensor:
    """Контрольный вход [batch, length]: случайные токены (зерно seed) словаря модели (или
    размера словаря model) — на нём эталонные логиты."""
    vocab = model.config.vocab_size if isinstance(model, torch.nn.Module) else model
    vocab = integer("model (модель или размер словаря)", vocab, 1)
    shape = (integer("batch", batch, 1), integer("length", length, 1))
    gen = torch.Generator().manual_seed(integer("seed", seed, 0))
    return torch.randint(0, vocab, shape, generator=gen)


# ----------------------------------------------------------------------------- движок


@dataclass
class ServeResult:
    """Ответ движка с закреплённой версией; read_consistent — прочитанное = весам версии."""

    output: Any
    version: int
    replica: str
    request_id: str
    read_checksum: str | None = None
    read_consistent: bool | None = None

    @property
    def logits(self) -> torch.Tensor:
        """Логиты запроса (для ``forward``)."""
        return self.output


@dataclass
class VerifyResult:
    """Итог проверки подготовительного буфера: совпала ли SHA-256 и max |Δ логита| ≤ atol."""

    replica: str
    version: int
    checksum_ok: bool
    max_abs_diff: float
    logits_ok: bool
    reasons: list[str]

    @property
    def ok(self) -> bool:
        """Проверка пройдена: нет ни одной причины отказа."""
        return not self.reasons


class InProcessEngine:
    """Движок генерации в процессе с двойным буфером весов (память — вдвое): ``forward``/``serve``
    читают активный и закрепляют версию за запросом; ``stage`` пишет подготовительный, ``verify``
    проверяет, ``ready`` — готовность, ``commit`` меняет указатель под замком."""

    def __init__(self, model, version: int = 0, name: str = "replica-0", log=None) -> None:
        if not isinstance(model, torch.nn.Module) or not list(model.parameters()):
            raise ValueError(f"model должно быть torch.nn.Module с параметрами, получено {model!r}")
        version = integer("version", version, 0)
        self.name = text("name", name)
        self.log = log if log is not None else EventLog()
        self._models = [copy.deepcopy(model).eval().requires_grad_(False) for _ in range(2)]
        self.param_names = [n for n, _ in model.named_parameters()]
        self._aliases = set(model.state_dict()) - set(self.param_names)
        self._shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        dtypes = {p.dtype for p in model.parameters()}
        self.dtype = dtypes.pop() if len(dtypes) == 1 else None
        self.vocab_size = model.config.vocab_size
        self._lock = threading.Lock()
        self._active = 0
        self._versions: list[int | None] = [version, None]
        self._checksums: list[str | None] = [state_checksum(self._models[0]), None]
        self._readers = [0, 0]
        self._staging_state = "empty"  # empty → staging → staged → verified | failed
        self._requests = 0
        self._asleep = False
        self.log.add("init", self.name, version, checksum=self._checksums[0], buffer="active")

    @property
    def version(self) -> int:
        """Версия, которую движок сейчас обслуживает (версия активного буфера)."""
        return int(self._versions[self._active])

    @property
    def staging_version(self) -> int | None:
        """Версия в подготовительном буфере (None — буфер пуст)."""
        return None if self._staging_state == "empty" else self._versions[1 - self._active]

    @property
    def active_checksum(self) -> str:
        """SHA-256 активного буфера, записанная при его подготовке (то, что движок заявляет)."""
        return self._checksums[self._active]

    def _buffer(self, idx: int) -> dict[str, torch.Tensor]:
        return {n: p.data for n, p in self._models[idx].named_parameters()}

    def weights(self, buffer: str = "active") -> dict[str, torch.Tensor]:
        """Тензоры буфера ("active" или "staging") без копирования — для опытов и приёма."""
        choice("buffer", buffer, ("active", "staging"))
        return self._buffer(self._active if buffer == "active" else 1 - self._active)

    def checksum(self) -> str:
        """SHA-256 активного буфера, посчитанная заново по его текущим байтам."""
        return state_checksum(self._models[self._active])

    def expected_checksum(self, source: Any) -> str:
        """Сумма, которую должен дать буфер после записи source (в типе весов движка)."""
        return state_checksum(self._source(source), dtype=self.dtype)

    # --- запросы ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _pinned(self, request_id: str | None):
        """Закрепляет активный буфер за запросом: версия фиксируется в начале запроса."""
        request_id = None if request_id is None else text("request_id", request_id)
        if self._asleep:
            raise RuntimeError(f"реплика {self.name} спит: веса выброшены, сначала wake")
        with self._lock:
            idx = self._active
            self._readers[idx] += 1
            version, checksum = self._versions[idx], self._checksums[idx]
            rid = request_id or f"{self.name}/req-{self._requests}"
            self._requests += 1
        try:
            self.log.add("serve", self.name, version, checksum=checksum, request_id=rid)
            yield self._models[idx], int(version), checksum, rid
        finally:
            with self._lock:
                self._readers[idx] -= 1

    def serve(self, request_fn: Callable, request_id: str | None = None) -> ServeResult:
        """request_fn(model, version) на закреплённом активном буфере: модель не сменится до конца
        запроса, даже если посреди него случится ``commit``."""
        with self._pinned(request_id) as (model, version, checksum, rid):
            output = request_fn(model, version)
        return ServeResult(output, version, self.name, rid)

    def forward(self, input_ids, request_id=None, between_layers=None, track_reads=False):
        """Логиты запроса на активном буфере, версия закреплена в начале. between_layers(i) —
        крючок перед i-м слоем; track_reads сверяет SHA-256 прочитанного с суммой версии."""
        input_ids = _check_input_ids(input_ids, self.vocab_size)
        with self._pinned(request_id) as (model, version, checksum, rid):
            reads: dict[str, torch.Tensor] = {}
            torn: set[str] = set()
            names = {id(p): n for n, p in model.named_parameters()}

            def snapshot(module, _args):
                for p in module.parameters(recurse=False):
                    name, value = names[id(p)], p.detach().clone()
                    if name in reads and not torch.equal(reads[name], value):
                        torn.add(name)  # общий (связанный) тензор изменился
                    reads.setdefault(name, value)

            handles = []
            try:
                for i, layer in enumerate([] if between_layers is None else _decoder_layers(model)):
                    hook = layer.register_forward_pre_hook(lambda *_, i=i: between_layers(i))
                    handles.append(hook)
                for module in model.modules() if track_reads else []:
                    handles.append(module.register_forward_pre_hook(snapshot))
                logits = _logits(model, input_ids)
            finally:
                for h in handles:
                    h.remove()
            read_checksum = read_ok = None
            if track_reads:
                for name, p in model.named_parameters():
                    reads.setdefault(name, p.detach().clone())
                read_checksum = state_checksum(reads)
                read_ok = read_checksum == checksum and not torn
        return ServeResult(logits, version, self.name, rid, read_checksum, read_ok)

    # --- публикация ------------------------------------------------------------------------

    def _source(self, state_dict: Any) -> dict:
        """Проверяет источник весов (модель или словарь) → {имя параметра: тензор}."""
        source = named_tensors(state_dict, "state_dict")
        missing = [n for n in self.param_names if n not in source]
        extra = [k for k in source if k not in self._shapes and k not in self._aliases]
        if missing or extra:
            raise ValueError(
                f"state_dict не совпадает с параметрами модели движка: нет {missing[:5]}, "
                f"лишние {extra[:5]}"
            )
        for n, shape in self._shapes.items():
            if (got := tuple(source[n].shape)) != shape:
                raise ValueError(f"state_dict: форма {n} {got} ≠ форме у движка {shape}")
        return {n: source[n] for n in self.param_names}

    def _check_version(self, version: Any) -> int:
        version = integer("version", version, 0)
        if version <= self.version:
            raise ValueError(
                f"version должна расти: > {self.version} ({self.name}), получено {version}"
            )
        return version

    @contextlib.contextmanager
    def staging(self, version: int):
        """Контекст приёма версии: отдаёт тензоры подготовительного буфера для записи на месте;
        пишет stage_start, по выходе считает сумму буфера и пишет stage_done."""
        version = self._check_version(version)
        idx = 1 - self._active
        if self._readers[idx]:
            raise RuntimeError(f"реплика {self.name}: подготовительный буфер ещё читают запросы")
        self._staging_state = "staging"
        self._versions[idx], self._checksums[idx] = version, None
        self.log.add("stage_start", self.name, version, buffer="staging")
        yield self._buffer(idx)
        self._checksums[idx] = state_checksum(self._models[idx])
        self._staging_state = "staged"
        checksum = self._checksums[idx]
        self.log.add("stage_done", self.name, version, checksum=checksum, buffer="staging")

    def stage_steps(self, state_dict: Any, version: int) -> Iterator[str]:
        """Генератор записи версии в подготовительный буфер: один тензор на шаг (yield имени)."""
        tensors = self._source(state_dict)
        with self.staging(version) as buffers:
            yield from transfer_weights(tensors, buffers)

    def stage(self, state_dict: Any, version: int) -> None:
        """Записывает веса state_dict (модель или словарь) версии version в staging-буфер."""
        for _ in self.stage_steps(state_dict, version):
            pass

    def verify(self, expected: str, probe_ids, reference, atol: float = DEFAULT_ATOL):
        """Проверяет подготовительный буфер: SHA-256 == expected и max |Δ логита| на probe_ids
        против эталона reference ≤ atol. Пишет verify_ok или verify_fail."""
        if self._staging_state not in ("staged", "verified", "failed"):
            raise RuntimeError(
                f"реплика {self.name}: проверять нечего, буфер {self._staging_state}"
            )
        expected = text("expected", expected)
        probe_ids = _check_input_ids(probe_ids, self.vocab_size, "probe_ids")
        atol = nonnegative("atol", atol)
        idx = 1 - self._active
        version, checksum = int(self._versions[idx]), state_checksum(self._models[idx])
        logits = _logits(self._models[idx], probe_ids)
        if not torch.is_tensor(reference) or reference.shape != logits.shape:
            raise ValueError(
                f"reference: нужны эталонные логиты формы {tuple(logits.shape)}, "
                f"получено {getattr(reference, 'shape', type(reference).__name__)}"
            )
        max_diff = float((logits.float() - reference.to(logits.device).float()).abs().max())
        logits_ok = math.isfinite(max_diff) and max_diff <= atol  # max |Δ логита| ≤ atol
        checksum_ok = checksum == expected  # SHA-256 побитно
        reasons = [
            f"сумма буфера {short_checksum(checksum)} ≠ ожидаемой {short_checksum(expected)}"
        ]
        reasons = [] if checksum_ok else reasons
        if not logits_ok:
            reasons.append(f"логиты отличаются от эталона на {max_diff:.3g} > atol={atol:g}")
        result = VerifyResult(self.name, version, checksum_ok, max_diff, logits_ok, reasons)
        self._staging_state = "verified" if result.ok else "failed"
        detail = "; ".join(reasons) or "сумма и логиты совпали с эталоном"
        detail += f" (max |Δ логитов| = {max_diff:.3g})"
        kind = "verify_ok" if result.ok else "verify_fail"
        self.log.add(
            kind, self.name, version, checksum=checksum, expected_checksum=expected, detail=detail
        )
        return result

    def ready(self) -> None:
        """Событие ready: версия записана и не провалила проверку — можно переключаться."""
        if self._staging_state not in ("staged", "verified"):
            raise RuntimeError(f"реплика {self.name} не готова: буфер {self._staging_state}")
        self.log.add("ready", self.name, self.staging_version)

    def commit(self) -> int:
        """Атомарно делает проверенный (verify_ok) подготовительный буфер активным (смена
        указателя под замком). Начатые запросы дочитывают старый буфер."""
        if self._staging_state != "verified":
            raise RuntimeError(
                f"реплика {self.name}: переключаться нельзя, буфер {self._staging_state}"
            )
        with self._lock:
            self._active = 1 - self._active
            self._staging_state = "empty"
            version, checksum = self._versions[self._active], self._checksums[self._active]
        self.log.add("commit", self.name, version, checksum=checksum, buffer="staging")
        return int(version)

    def sleep(self) -> None:
        """Сон уровня 2 (vLLM): веса обоих буферов выброшены (NaN), метка версии остаётся;
        до ``wake`` запросы отвергаются, а ``publish`` по-прежнему пишет и переключает."""
        with self._lock:
            for t in [*self._buffer(0).values(), *self._buffer(1).values()]:
                t.fill_(math.nan)
            self._asleep = True

    def wake(self, state_dict: Any = None) -> None:
        """Пробуждение: state_dict (модель или словарь) перечитывается в активный буфер, как
        ``reload_weights`` vLLM — исходные веса с диска; None — без перечитывания. Версия та же."""
        if state_dict is not None:
            for _ in transfer_weights(self._source(state_dict), self.weights()):
                pass
        self._asleep = False

    def discard_staging(self) -> None:
        """Забывает подготовленную версию (после abort): активный буфер не меняется."""
        self._staging_state = "empty"

    def corrupt_staging(self) -> str:
        """Для опыта: +1 к первому числу первого тензора staging-буфера; возвращает имя тензора."""
        if self._staging_state == "empty":
            raise RuntimeError(f"реплика {self.name}: подготовительный буфер пуст")
        self.weights("staging")[self.param_names[0]].view(-1)[0] += 1.0
        return self.param_names[0]

    def unsafe_update_steps(self, state_dict: Any, version: int) -> Iterator[str]:
        """СЛОМАННЫЙ режим: пишет тензоры по одному на месте в АКТИВНЫЙ буфер (yield после
        каждого); метка версии меняется в конце, без проверки и барьера (buffer="active")."""
        tensors, version, idx = self._source(state_dict), self._check_version(version), self._active
        detail = "запись на месте в активный буфер, пока идут запросы"
        self.log.add("stage_start", self.name, version, buffer="active", detail=detail)
        yield from transfer_weights(tensors, self._buffer(idx))
        checksum = state_checksum(self._models[idx])
        self.log.add("stage_done", self.name, version, checksum=checksum, buffer="active")
        with self._lock:
            self._versions[idx], self._checksums[idx] = version, checksum
        note = "метка версии сменилась без проверки и барьера"
        self.log.add("commit", self.name, version, checksum=checksum, buffer="active", detail=note)


def make_replicas(model, n: int = 2) -> list:
    """n реплик ``InProcessEngine`` одной модели с общим журналом; имена replica-0, replica-1, …"""
    n, log = integer("n", n, 1, 16), EventLog()
    return [InProcessEngine(model, name=f"replica-{i}", log=log) for i in range(n)]


# ----------------------------------------------------------------------------- публикация


@dataclass
class PublishReport:
    """Итог ``publish``: переключились ли реплики, проверки и запросы во время публикации (строка
    на запрос, столбцы ``_REQUEST_COLUMNS``; matches_* — логиты побитно = эталону версии)."""

    version: int
    atomic: bool
    committed: bool
    verify_results: list[VerifyResult]
    requests: list[dict]
    log: EventLog
    outputs: list[torch.Tensor]

    @property
    def torn_reads(self) -> int:
        """Сколько запросов прочитали смесь версий."""
        return sum(bool(r["torn"]) for r in self.requests)

    def requests_frame(self):
        """Таблица pandas запросов, шедших во время публикации."""
        return pd.DataFrame(self.requests, columns=_REQUEST_COLUMNS)

    def verify_frame(self):
        """Таблица pandas проверок: реплика, версия, ok, checksum_ok, max_abs_diff, logits_ok."""
        cols = ["replica", "version", "ok", "checksum_ok", "max_abs_diff", "logits_ok"]
        rows = [{c: getattr(v, c) for c in cols} for v in self.verify_results]
        reasons = ["; ".join(v.reasons) for v in self.verify_results]
        return pd.DataFrame(rows).assign(reasons=reasons)

    def summary(self) -> str:
        """Одна строка по-русски: режим, версия, переключение, число смешанных чтений."""
        mode = "атомарно (двойной буфер)" if self.atomic else "на месте (без двойного буфера)"
        state = "переключены все реплики" if self.committed else "переключения нет (abort)"
        out = f"Публикация версии {self.version} {mode}: {state}"
        if self.requests:
            n, torn = len(self.requests), self.torn_reads
            out += f"; запросов во время публикации: {n}, смесь версий: {torn}"
        return out + "."


def _publish_steps(engines, tensors, version, atomic, probe, ref, corrupt, results):
    """Шаги публикации по одному на yield (запись тензора, проверка реплики): запись во все
    подготовительные буферы → проверка (VerifyResult — в results) → ready → барьер → commit всех
    подряд; одна неудача — abort."""
    if not atomic:
        for e in engines:
            yield from e.unsafe_update_steps(tensors, version)
        return
    expected = engines[0].expected_checksum(tensors)
    for e in engines:
        yield from e.stage_steps(tensors, version)
        if e.name == corrupt:
            e.corrupt_staging()
    for e in engines:
        results.append(e.verify(expected, probe, ref))
        yield f"verify {e.name}"
    failed = [r.replica for r in results if not r.ok]
    for e in engines:
        if e.name not in failed:
            e.ready()
    if failed:
        why = f"не прошли проверку: {', '.join(failed)}"
        engines[0].log.add("abort", "publisher", version, detail=why)
        for e in engines:
            e.discard_staging()
        return
    why = f"готовы все реплики: {len(engines)}"
    engines[0].log.add("barrier", "publisher", version, detail=why)
    for e in engines:  # подряд, без запросов между ними
        e.commit()


def publish(
    engines,
    state_dict,
    version,
    atomic: bool = True,
    requests=None,
    corrupt: str | None = None,
) -> PublishReport:
    """Публикует state_dict версии version на реплики с общим журналом, пока идут запросы
    requests: запрос i — на реплике i mod n, перед каждым его слоем —
    ⌈шагов публикации / (слоёв · ⌈запросов/2⌉)⌉ шагов. Проверка — SHA-256 и max |Δ логита| ≤
    DEFAULT_ATOL на ``probe_input``; atomic=False — запись на месте; corrupt — порча буфера реплики."""
    engines = [engines] if isinstance(engines, InProcessEngine) else engines
    ok = isinstance(engines, Sequence) and engines
    if not ok or not all(isinstance(e, InProcessEngine) for e in engines):
        raise ValueError("engines должно быть непустым списком InProcessEngine")
    if len({id(e.log) for e in engines}) != 1:
        raise ValueError("engines должны писать в один журнал (см. make_replicas)")
    version = integer("version", version, 0)
    flag("atomic", atomic)
    requests = [] if requests is None else requests
    if torch.is_tensor(requests) or not isinstance(requests, Sequence | Iterator):
        raise ValueError(
            "requests должно быть списком тензоров-входов (по одному на запрос) или None, "
            f"получено {type(requests).__name__}"
        )
    vocab, n = engines[0].vocab_size, len(engines)
    inputs = [_check_input_ids(x, vocab, "requests") for x in requests]
    for e in engines:
        e._check_version(version)
    if corrupt is not None:  # порча подготовительного буфера: только при atomic=True
        names = [e.name for e in engines] if atomic else [None]
        choice("corrupt" if atomic else "corrupt при atomic=False", corrupt, names)
    tensors = engines[0]._source(state_dict)
    active = [e._models[e._active] for e in engines]
    template = active[0]
    probe = probe_input(template)
    old_refs = [_logits(active[i % n], x) for i, x in enumerate(inputs)]
    reference = copy.deepcopy(template).requires_grad_(False)
    for _ in transfer_weights(tensors, dict(reference.named_parameters())):
        pass
    new_refs = [_logits(reference, x) for x in inputs]
    total = n * len(engines[0].param_names) + (n if atomic else 0) + 1
    busy = len(_decoder_layers(template)) * max(1, math.ceil(len(inputs) / 2))
    steps_per_layer = max(1, math.ceil(total / busy))
    results: list[VerifyResult] = []
    ref = _logits(reference, probe)
    steps = _publish_steps(engines, tensors, version, atomic, probe, ref, corrupt, results)

    def advance(_layer: int) -> None:  # перед каждым слоем запроса — steps_per_layer шагов
        for _ in zip(range(steps_per_layer), steps):
            pass

    rows, outputs = [], []
    for i, x in enumerate(inputs):
        rid = f"{engines[i % n].name}/v{version}-req-{i}"
        res = engines[i % n].forward(x, rid, advance, track_reads=True)
        rows.append(_request_row(res, old_refs[i], new_refs[i], engines[0].log))
        outputs.append(res.logits)
    for _ in steps:
        pass
    committed = all(r.ok for r in results)  # без atomic проверок нет: переключены все
    return PublishReport(version, atomic, committed, results, rows, engines[0].log, outputs)


def _request_row(res: ServeResult, old_ref, new_ref, log: EventLog) -> dict:
    """Строка запроса для ``PublishReport.requests``; смесь версий — событие torn_read."""
    matches_old = bool(torch.equal(res.logits, old_ref))
    matches_new = bool(torch.equal(res.logits, new_ref))
    torn = not res.read_consistent or not (matches_old or matches_new)
    outcome = "смесь версий" if torn else "старые веса" if matches_old else "новые веса"
    if torn:
        detail = f"ответ помечен версией {res.version}, а прочитаны веса другой версии"
        if not (matches_old or matches_new):
            detail = (
                f"ответ помечен версией {res.version}, но прочитанные веса "
                f"({short_checksum(res.read_checksum)}) не равны ни одной версии; логиты не совпали "
                "ни со старым, ни с новым эталоном"
            )
        ids = {"checksum": res.read_checksum, "request_id": res.request_id}
        log.add("torn_read", res.replica, res.version, detail=detail, **ids)
    values = [res.request_id, res.replica, res.version, matches_old, matches_new]
    return dict(zip(_REQUEST_COLUMNS, values + [bool(res.read_consistent), torn, outcome]))


def russian(frame):
    """Копия таблицы pandas для показа студенту: русские заголовки (``COLUMN_NAMES``), целые
    от 10 000 — с разрядами через неразрывный пробел (``fmt.num``: 4 000 000, а не 4000000)."""
    out = frame.rename(columns=COLUMN_NAMES)
    for col in out.columns:
        values = out[col]
        if values.dtype.kind in "iu" and len(values) and values.abs().max() >= 10_000:
            out[col] = values.map(num)
    return out
