"""Урок 12.4, шаг 12.4.5: версионированная атомарная публикация весов движкам генерации.

Четыре свойства синхронизации из лекции и где они здесь:

1. **Идентификатор версии.** Движок сообщает версию, которую реально обслуживает:
   ``InProcessEngine.version``, а каждый запрос (``forward``/``serve``) получает версию,
   закреплённую за ним в момент начала.
2. **Атомарность (двойной буфер).** У движка две полные копии весов: активная (её читают
   запросы) и подготовительная (staging, в неё пишется новая версия). ``commit`` — смена
   указателя под замком: запрос видит старые или новые веса, смеси не бывает. Запрос,
   начатый до переключения, дочитывает свой (старый) буфер до конца.
3. **Барьер готовности.** ``Publisher`` записывает версию во все реплики, каждая проверяет
   себя и сообщает ``ready``; переключение (commit) — только когда готовы все. Одна неудачная
   проверка отменяет публикацию везде (``abort``).
4. **Проверка.** Контрольная сумма SHA-256 всех тензоров (``transport.state_checksum``) и
   эталонные логиты на фиксированном контрольном входе (допуск ``atol``).

Сломанный режим для сравнения: ``publish(..., atomic=False)`` пишет тензоры по одному
**на месте** в активный буфер, пока идут запросы. Чередование детерминированно, без потоков:
запрос читает модель слой за слоем, а между слоями (крючок ``between_layers``) публикатор
делает несколько шагов записи. Так запрос действительно читает смесь версий настоящих весов
модели; проверка «что прочитано» (сумма тензоров в момент чтения) и сравнение его логитов с
эталонами обеих версий это ловят, в журнале — событие ``torn_read``.

Каждый шаг пишется в журнал ``EventLog`` (схема — ``EVENT_FIELDS`` и ``EVENT_TYPES``), его
можно превратить в таблицу pandas. ``audit_log(events)`` — независимая проверка любого журнала
этой схемы (не только нашего движка) на нарушения протокола, коды — ``AUDIT_RULES``.

Уровень C — ``broadcast_weights`` (точка входа ``multiproc.launch``): ранг 0 — тренер, ранги
1..N−1 — генераторы; версии рассылаются ``dist.broadcast`` прямо в подготовительные буферы,
барьер готовности — ``all_reduce(MIN)`` флагов проверки. Там же замер времени рассылки от
числа параметров. ``sync_frame``, ``sync_size_frame`` и ``merged_events`` превращают итог
запуска в таблицы и общий журнал.
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from course_utils.args import (
    flag,
    integer,
    is_count,
    is_real,
    nonnegative,
    optional_integer,
    text,
)
from course_utils.multiproc.transport import (
    state_checksum,
)

__all__ = [
    "EVENT_FIELDS",
    "EVENT_TYPES",
    "AUDIT_RULES",
    "DEFAULT_ATOL",
    "EventLog",
    "ServeResult",
    "VerifyResult",
    "PublishReport",
    "InProcessEngine",
    "Publisher",
    "make_replicas",
    "publish",
    "probe_input",
    "reference_logits",
    "audit_log",
    "russian",
    "COLUMN_NAMES",
]

# Допуск сравнения логитов с эталоном. Один тип весов и одно устройство дают побитное
# совпадение; допуск нужен для движка в другом типе (bf16 против fp32 тренера).
DEFAULT_ATOL = 1e-4
PUBLISHER = "publisher"
TRAINER = "trainer"
# Наибольший размер синтетического тензора в замере, параметров (fp32: 256 МиБ на процесс).
MAX_SIZE = 2**26

# ----------------------------------------------------------------------------- схема журнала

EVENT_FIELDS = {
    "seq": "порядковый номер события в журнале (0, 1, 2, …)",
    "t": (
        "время события, с: от создания журнала (perf_counter) или, у процессов уровня C, "
        "от общей точки отсчёта (time.time() ранга 0)"
    ),
    "replica": "кто записал: реплика ('replica-0', 'rank-1') или публикатор ('publisher', 'trainer')",
    "event": "тип события — один из EVENT_TYPES",
    "version": "версия весов, к которой относится событие (у serve — версия, закреплённая за запросом)",
    "checksum": (
        "SHA-256 весов (state_checksum): у stage_done — записанного буфера, у verify_* — "
        "проверенного, у init/commit/serve — активного; None, если не считалась"
    ),
    "expected_checksum": "у verify_*: сумма, которую прислал публикатор",
    "request_id": "у serve и torn_read: идентификатор запроса",
    "buffer": "у stage_*/commit: 'staging' (второй буфер) или 'active' (запись на месте)",
    "detail": "пояснение по-русски",
}

EVENT_TYPES = {
    "init": "реплика загружена и обслуживает начальную версию",
    "stage_start": "начата запись версии в буфер",
    "stage_done": "запись версии в буфер закончена",
    "verify_ok": "проверка записанной версии прошла (сумма и эталонные логиты)",
    "verify_fail": "проверка записанной версии не прошла",
    "ready": "реплика готова переключиться: версия записана и проверена",
    "barrier": "барьер готовности пройден: готовы все реплики",
    "abort": "публикация версии отменена: не переключается ни одна реплика",
    "commit": "реплика переключилась на версию (смена указателя активного буфера)",
    "serve": "начат запрос; версия закреплена за ним до конца запроса",
    "torn_read": "проверка нашла, что запрос прочитал смесь версий",
}

AUDIT_RULES = {
    "serve_before_barrier": "реплика обслуживает новую версию до барьера готовности",
    "commit_before_barrier": "переключение до того, как готовы все реплики (барьер не пройден)",
    "barrier_not_ready": "барьер отмечен пройденным, хотя не все реплики сообщили ready",
    "commit_without_verify": "переключение без успешной проверки (verify_ok) этой версии",
    "version_backwards": "версия реплики уменьшилась (переключение или запрос на старую версию)",
    "serve_uncommitted": "реплика обслуживает версию, на которую не переключалась",
    "replicas_diverged": (
        "после переключения (commit) хотя бы одной реплики на версию реплики обслуживают "
        "разные версии"
    ),
    "checksum_mismatch": "контрольная сумма версии не совпадает с эталонной",
    "inplace_update": "версия пишется на месте в активный буфер (нет двойного буфера)",
    "torn_read": "запрос прочитал смесь версий",
}

# Русские заголовки таблиц для показа (``russian``); в коде столбцы остаются английскими.
COLUMN_NAMES = {
    "request_id": "запрос",
    "replica": "реплика",
    "served_version": "версия ответа",
    "matches_old": "= старым весам",
    "matches_new": "= новым весам",
    "read_consistent": "чтение цельное",
    "torn": "смесь версий",
    "outcome": "итог",
    "version": "версия",
    "ok": "проверка пройдена",
    "checksum_ok": "сумма совпала",
    "max_abs_diff": "max |Δ логита|",
    "logits_ok": "логиты совпали",
    "reasons": "причины",
    "rank": "ранг",
    "role": "роль",
    "bytes": "байт",
    "wait_s": "ожидание, с",
    "broadcast_s": "рассылка, с",
    "verify_s": "проверка, с",
    "barrier_s": "барьер, с",
    "commit_s": "переключение, с",
    "committed": "переключились",
    "served_matches_reference": "ответ = эталону",
    "size": "параметров",
    "seconds": "рассылка, с (медиана)",
    "trainer_s": "у тренера, с",
    "gib_per_s": "ГиБ/с",
    "repeats": "повторов",
}

_REPLICA_EVENTS = ("stage_start", "stage_done", "verify_ok", "verify_fail", "ready", "commit")


def _short_checksum(checksum: Any) -> str:
    return (
        f"{checksum[:10]}…" if isinstance(checksum, str) and len(checksum) > 10 else str(checksum)
    )


class EventLog:
    """Журнал событий публикации: список словарей со схемой ``EVENT_FIELDS``.

    t — секунды ``clock() − t0`` (по умолчанию perf_counter от создания журнала). Журнал
    можно передать в ``audit_log`` и превратить в таблицу ``frame()``.
    """

    def __init__(self, clock: Callable[[], float] | None = None, t0: float | None = None) -> None:
        if clock is not None and not callable(clock):
            raise ValueError(f"clock должно быть функцией без аргументов, получено {clock!r}")
        if t0 is not None and not is_real(t0):
            raise ValueError(f"t0 должно быть конечным числом секунд или None, получено {t0!r}")
        self._clock = clock or time.perf_counter
        self._t0 = float(self._clock() if t0 is None else t0)
        self._events: list[dict] = []
        self._lock = threading.Lock()

    def add(self, event: str, replica: str, version: int, **fields: Any) -> dict:
        """Добавляет событие event (из EVENT_TYPES) реплики replica о версии version ≥ 0.

        Необязательные поля — checksum, expected_checksum, request_id, buffer, detail.
        Возвращает словарь события (seq и t заполняются сами).
        """
        if not isinstance(event, str) or event not in EVENT_TYPES:
            raise ValueError(
                f"event должно быть одним из {sorted(EVENT_TYPES)}, получено {event!r}"
            )
        replica = text("replica", replica)
        version = integer("version", version, 0)
        optional = [k for k in EVENT_FIELDS if k not in ("seq", "t", "replica", "event", "version")]
        unknown = sorted(set(fields) - set(optional))
        if unknown:
            raise ValueError(f"неизвестные поля события {unknown}; допустимы {optional}")
        with self._lock:
            row = {
                "seq": len(self._events),
                "t": self._clock() - self._t0,
                "replica": replica,
                "event": event,
                "version": int(version),
                "checksum": None,
                "expected_checksum": None,
                "request_id": None,
                "buffer": None,
                "detail": "",
            }
            row.update(fields)
            self._events.append(row)
        return row

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[dict]:
        return iter(list(self._events))

    def __getitem__(self, index):
        return self._events[index]

    def to_list(self) -> list[dict]:
        """Копия событий: список словарей (JSON-сериализуемый)."""
        return [dict(e) for e in self._events]

    def frame(self):
        """Таблица pandas: строка на событие, столбцы — ``EVENT_FIELDS``."""
        import pandas as pd

        return pd.DataFrame(self.to_list(), columns=list(EVENT_FIELDS))


# ----------------------------------------------------------------------------- помощники модели


def _named_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters())


def _uniform_dtype(model: torch.nn.Module):
    dtypes = {p.dtype for p in model.parameters()}
    return dtypes.pop() if len(dtypes) == 1 else None


def _vocab_size(model: torch.nn.Module) -> int | None:
    """Размер словаря: config.vocab_size, иначе выходной Linear, иначе первый nn.Embedding."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if is_count(vocab):
        return int(vocab)
    out = getattr(model, "get_output_embeddings", lambda: None)()
    if isinstance(out, torch.nn.Linear):
        return int(out.out_features)
    emb = next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)
    return int(emb.num_embeddings) if emb is not None else None


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Слои, между которыми можно вклиниться: блоки декодера (+ выходной слой)."""
    layers = None
    for path in ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, torch.nn.ModuleList) and len(obj):
            layers = list(obj)
            break
    if layers is None:
        lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
        layers = list(max(lists, key=len)) if lists else list(model.children())
    out = getattr(model, "get_output_embeddings", lambda: None)()
    if isinstance(out, torch.nn.Module) and all(out is not m for m in layers):
        layers.append(out)
    return layers or [model]


def _check_input_ids(input_ids: Any, vocab: int | None, name: str = "input_ids") -> torch.Tensor:
    if not torch.is_tensor(input_ids) or input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} должно быть тензором целых (int64), получено {type(input_ids)}")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.dim() != 2 or input_ids.numel() == 0:
        raise ValueError(
            f"{name}: нужна непустая матрица [пакет, длина], форма {tuple(input_ids.shape)}"
        )
    if vocab is not None and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab):
        raise ValueError(f"{name}: номера токенов должны лежать в [0, {vocab - 1}]")
    return input_ids.long()


@torch.no_grad()
def _logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    device = next(model.parameters()).device
    kwargs = {"use_cache": False} if hasattr(model, "config") else {}
    out = model(input_ids.to(device), **kwargs)
    return getattr(out, "logits", out).detach()


def probe_input(model: Any, batch: int = 2, length: int = 12, seed: int = 0) -> torch.Tensor:
    """Контрольный вход [batch, length]: фиксированные случайные токены (зерно seed).

    model — модель (размер словаря берётся из config.vocab_size) или сам размер словаря.
    На этом входе считаются эталонные логиты каждой версии.
    """
    vocab = int(model) if is_count(model) else None
    if isinstance(model, torch.nn.Module):
        vocab = _vocab_size(model)
    if vocab is None or vocab < 1:
        raise ValueError(
            f"model должно быть моделью с config.vocab_size или размером словаря ≥ 1, "
            f"получено {model!r}"
        )
    batch = integer("batch", batch, 1)
    length = integer("length", length, 1)
    seed = integer("seed", seed, 0)
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, int(vocab), (batch, length), generator=gen)


def reference_logits(model: torch.nn.Module, probe_ids: torch.Tensor) -> torch.Tensor:
    """Эталонные логиты: forward модели (весов версии) на контрольном входе, без градиентов."""
    if not isinstance(model, torch.nn.Module) or not list(model.parameters()):
        raise ValueError(
            f"model должно быть torch.nn.Module с параметрами, получено {type(model).__name__}"
        )
    vocab = _vocab_size(model)
    probe_ids = _check_input_ids(probe_ids, vocab, "probe_ids")
    try:
        return _logits(model, probe_ids)
    except IndexError as exc:  # словарь модели неизвестен заранее: номер токена вне таблицы
        if vocab is not None:
            raise
        raise ValueError(
            f"probe_ids: номер токена вне словаря модели (forward: {exc}); нужны номера в "
            f"[0, размер словаря − 1], получено [{int(probe_ids.min())}, {int(probe_ids.max())}]"
        ) from None


def _source_tensors(source: Any, shapes: Mapping[str, tuple], aliases: set[str]) -> dict:
    """Проверяет источник весов (модель или словарь) и возвращает {имя параметра: тензор}."""
    names = list(shapes)
    if isinstance(source, torch.nn.Module):
        source = _named_params(source)
    if not isinstance(source, Mapping) or not source:
        raise ValueError(
            "state_dict должно быть моделью или непустым словарём «имя → тензор», "
            f"получено {type(source).__name__}"
        )
    bad = [k for k, v in source.items() if not isinstance(k, str) or not torch.is_tensor(v)]
    if bad:
        raise ValueError(f"state_dict: нужны пары «строка → тензор», плохие ключи: {bad[:5]}")
    missing = [n for n in names if n not in source]
    extra = [k for k in source if k not in names and k not in aliases]
    if missing or extra:
        raise ValueError(
            f"state_dict не совпадает с параметрами модели движка: нет {missing[:5]}, "
            f"лишние {extra[:5]}"
        )
    wrong = [n for n in names if tuple(source[n].shape) != shapes[n]]
    if wrong:
        n = wrong[0]
        raise ValueError(
            f"state_dict: форма {n} {tuple(source[n].shape)} ≠ форме у движка {shapes[n]}"
        )
    return {n: source[n] for n in names}


# ----------------------------------------------------------------------------- движок


@dataclass
class ServeResult:
    """Ответ движка: выход (логиты или результат request_fn) и закреплённая за запросом версия.

    read_checksum — SHA-256 того, что запрос реально прочитал (если отслеживалось);
    read_consistent — прочитанное совпало с весами версии, которой помечен ответ.
    """

    output: Any
    version: int
    replica: str
    request_id: str
    checksum: str | None
    read_checksum: str | None = None
    read_consistent: bool | None = None

    @property
    def logits(self) -> torch.Tensor:
        """Логиты запроса (для ``forward``)."""
        return self.output


@dataclass
class VerifyResult:
    """Итог проверки подготовительного буфера реплики: сумма и эталонные логиты."""

    replica: str
    version: int
    ok: bool
    checksum: str
    expected_checksum: str | None
    checksum_ok: bool | None
    max_abs_diff: float | None
    logits_ok: bool | None
    reasons: list[str] = field(default_factory=list)


class InProcessEngine:
    """Движок генерации в процессе с двойным буфером весов (активный и подготовительный).

    ``forward``/``serve`` читают активный буфер и закрепляют за запросом его версию;
    ``stage`` пишет новую версию в подготовительный буфер; ``verify`` проверяет его;
    ``ready`` сообщает готовность; ``commit`` атомарно меняет указатель. Все шаги пишутся в
    журнал ``log`` (общий для реплик — ``make_replicas``). Модель копируется дважды
    (``copy.deepcopy``): это цена двойного буфера — вдвое больше памяти под веса.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        version: int = 0,
        name: str = "replica-0",
        log: EventLog | None = None,
    ) -> None:
        if not isinstance(model, torch.nn.Module) or not list(model.parameters()):
            raise ValueError(f"model должно быть torch.nn.Module с параметрами, получено {model!r}")
        version = integer("version", version, 0)
        name = text("name", name)
        if log is not None and not isinstance(log, EventLog):
            raise ValueError(f"log должно быть EventLog или None, получено {type(log).__name__}")
        self.name = name
        self.log = log if log is not None else EventLog()
        self._models = [copy.deepcopy(model).eval(), copy.deepcopy(model).eval()]
        for m in self._models:
            m.requires_grad_(False)
        self.param_names = list(_named_params(model))
        self._aliases = set(model.state_dict()) - set(self.param_names)
        self._shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        self.dtype = _uniform_dtype(model)
        self.vocab_size = _vocab_size(model)
        self._lock = threading.Lock()
        self._active = 0
        self._versions: list[int | None] = [int(version), None]
        self._checksums: list[str | None] = [self._compute_checksum(0), None]
        self._readers = [0, 0]
        self._staging_state = "empty"
        self._requests = 0
        self.log.add("init", self.name, version, checksum=self._checksums[0], buffer="active")

    # --- состояние -------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """Версия, которую движок сейчас обслуживает (версия активного буфера)."""
        return int(self._versions[self._active])

    @property
    def staging_version(self) -> int | None:
        """Версия в подготовительном буфере (None — буфер пуст)."""
        return None if self._staging_state == "empty" else self._versions[1 - self._active]

    @property
    def staging_state(self) -> str:
        """Состояние подготовительного буфера: empty, staging, staged, verified, failed."""
        return self._staging_state

    @property
    def active_checksum(self) -> str:
        """SHA-256 активного буфера, записанная при его подготовке (то, что движок заявляет)."""
        return self._checksums[self._active]

    def _index(self, buffer: str) -> int:
        if buffer not in ("active", "staging"):
            raise ValueError(f"buffer должно быть 'active' или 'staging', получено {buffer!r}")
        return self._active if buffer == "active" else 1 - self._active

    def weights(self, buffer: str = "active") -> dict[str, torch.Tensor]:
        """Тензоры буфера ("active" или "staging") без копирования — для опытов и приёма."""
        return {n: p.data for n, p in _named_params(self._models[self._index(buffer)]).items()}

    def _compute_checksum(self, idx: int) -> str:
        return state_checksum(_named_params(self._models[idx]))

    def checksum(self, buffer: str = "active") -> str:
        """SHA-256 буфера, посчитанная заново по его текущим байтам."""
        return self._compute_checksum(self._index(buffer))

    def expected_checksum(self, source: Any) -> str:
        """Сумма, которую должен дать буфер после записи source (в типе весов движка)."""
        tensors = self._source(source)
        return state_checksum(tensors, dtype=self.dtype)

    # --- запросы ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _pinned(self, request_id: str | None):
        """Закрепляет активный буфер за запросом: версия фиксируется в начале запроса."""
        with self._lock:
            idx = self._active
            self._readers[idx] += 1
            version, checksum = self._versions[idx], self._checksums[idx]
            rid = request_id if request_id is not None else f"{self.name}/req-{self._requests}"
            self._requests += 1
        try:
            self.log.add("serve", self.name, version, checksum=checksum, request_id=rid)
            yield idx, self._models[idx], int(version), checksum, rid
        finally:
            with self._lock:
                self._readers[idx] -= 1

    def serve(self, request_fn: Callable, request_id: str | None = None) -> ServeResult:
        """Выполняет request_fn(model, version) на закреплённом активном буфере.

        Подходит для генерации: модель не сменится до конца запроса, даже если посреди него
        случится ``commit``; ответ помечается версией, закреплённой в начале.
        """
        if not callable(request_fn):
            raise ValueError(
                f"request_fn должно быть функцией (model, version), получено {request_fn!r}"
            )
        if request_id is not None and not isinstance(request_id, str):
            raise ValueError(f"request_id должно быть строкой или None, получено {request_id!r}")
        with self._pinned(request_id) as (_, model, version, checksum, rid):
            output = request_fn(model, version)
        return ServeResult(output, version, self.name, rid, checksum)

    def forward(
        self,
        input_ids: torch.Tensor,
        request_id: str | None = None,
        between_layers: Callable[[int], Any] | None = None,
        track_reads: bool = False,
    ) -> ServeResult:
        """Логиты запроса на активном буфере; версия и сумма закреплены в начале запроса.

        between_layers(i) вызывается перед i-м слоем (блоки декодера, затем выходной слой) —
        точка, где публикатор может вклиниться. track_reads=True копирует каждый параметр в
        момент чтения и сравнивает SHA-256 прочитанного с суммой версии (read_consistent).
        """
        input_ids = _check_input_ids(input_ids, self.vocab_size)
        if between_layers is not None and not callable(between_layers):
            raise ValueError(
                f"between_layers должно быть функцией (i) или None, получено {between_layers!r}"
            )
        track_reads = flag("track_reads", track_reads)
        if request_id is not None and not isinstance(request_id, str):
            raise ValueError(f"request_id должно быть строкой или None, получено {request_id!r}")
        with self._pinned(request_id) as (_, model, version, checksum, rid):
            handles = []
            reads: dict[str, torch.Tensor] = {}
            torn_names: set[str] = set()
            try:
                if between_layers is not None:
                    for i, layer in enumerate(_decoder_layers(model)):
                        handles.append(
                            layer.register_forward_pre_hook(lambda _m, _a, i=i: between_layers(i))
                        )
                if track_reads:
                    canon = {id(p): n for n, p in model.named_parameters()}

                    def snapshot(module, _args):
                        for p in module.parameters(recurse=False):
                            name = canon.get(id(p))
                            if name is None:
                                continue
                            value = p.detach().clone()
                            if name not in reads:
                                reads[name] = value
                            elif not torch.equal(reads[name], value):
                                torn_names.add(name)  # общий (связанный) тензор изменился

                    for module in model.modules():
                        if any(True for _ in module.parameters(recurse=False)):
                            handles.append(module.register_forward_pre_hook(snapshot))
                logits = _logits(model, input_ids)
            finally:
                for h in handles:
                    h.remove()
            read_checksum = read_ok = None
            if track_reads:
                for name, p in _named_params(model).items():
                    reads.setdefault(name, p.detach().clone())
                read_checksum = state_checksum(reads)
                read_ok = read_checksum == checksum and not torn_names
        return ServeResult(logits, version, self.name, rid, checksum, read_checksum, read_ok)

    # --- публикация ------------------------------------------------------------------------

    def _source(self, state_dict: Any) -> dict:
        return _source_tensors(state_dict, self._shapes, self._aliases)

    def _check_version(self, version: Any) -> int:
        version = integer("version", version, 0)
        if version <= self.version:
            raise ValueError(
                f"version должна расти: реплика {self.name} уже обслуживает {self.version}, "
                f"получено {version}"
            )
        return int(version)

    @contextlib.contextmanager
    def staging(self, version: int):
        """Контекст приёма версии: отдаёт тензоры подготовительного буфера для записи на месте.

        Пишет stage_start, по выходе считает сумму буфера и пишет stage_done. Нужен приёму
        по ``dist.broadcast``; в процессе удобнее ``stage``.
        """
        version = self._check_version(version)
        idx = 1 - self._active
        if self._readers[idx]:
            raise RuntimeError(
                f"реплика {self.name}: подготовительный буфер ещё читают {self._readers[idx]} "
                "запрос(а) прошлой версии — писать в него нельзя"
            )
        self._staging_state = "staging"
        self._versions[idx] = version
        self._checksums[idx] = None
        self.log.add("stage_start", self.name, version, buffer="staging")
        yield {n: p.data for n, p in _named_params(self._models[idx]).items()}
        self._checksums[idx] = self._compute_checksum(idx)
        self._staging_state = "staged"
        self.log.add(
            "stage_done", self.name, version, checksum=self._checksums[idx], buffer="staging"
        )

    def stage_steps(self, state_dict: Any, version: int) -> Iterator[str]:
        """Генератор записи версии в подготовительный буфер: один тензор на шаг (yield имени)."""
        tensors = self._source(state_dict)
        with self.staging(version) as buffers:
            for name in self.param_names:
                with torch.no_grad():  # не держим no_grad через yield: он глобален для потока
                    buffers[name].copy_(tensors[name])
                yield name

    def stage(self, state_dict: Any, version: int) -> None:
        """Записывает веса state_dict (модель или словарь) версии version в подготовительный буфер."""
        for _ in self.stage_steps(state_dict, version):
            pass

    def verify(
        self,
        expected_checksum: str | None,
        probe_ids: torch.Tensor | None = None,
        reference: torch.Tensor | None = None,
        atol: float = DEFAULT_ATOL,
    ) -> VerifyResult:
        """Проверяет подготовительный буфер: SHA-256 == expected_checksum и логиты на probe_ids
        отличаются от эталона reference не больше чем на atol (max |Δ|). Пишет verify_ok/fail.
        """
        if self._staging_state not in ("staged", "verified", "failed"):
            raise RuntimeError(
                f"реплика {self.name}: проверять нечего, буфер {self._staging_state}"
            )
        if expected_checksum is not None and not isinstance(expected_checksum, str):
            raise ValueError(
                f"expected_checksum должно быть строкой или None, получено {expected_checksum!r}"
            )
        if (probe_ids is None) != (reference is None):
            raise ValueError("probe_ids и reference задаются вместе (или оба None)")
        if expected_checksum is None and probe_ids is None:
            raise ValueError(
                "нужна хотя бы одна проверка: expected_checksum или probe_ids+reference"
            )
        atol = nonnegative("atol", atol)
        idx = 1 - self._active
        version = int(self._versions[idx])
        checksum = self._compute_checksum(idx)
        reasons = []
        checksum_ok = None
        if expected_checksum is not None:
            checksum_ok = checksum == expected_checksum
            if not checksum_ok:
                reasons.append(
                    f"сумма буфера {_short_checksum(checksum)} ≠ ожидаемой {_short_checksum(expected_checksum)}"
                )
        max_diff = logits_ok = None
        if probe_ids is not None:
            probe_ids = _check_input_ids(probe_ids, self.vocab_size, "probe_ids")
            logits = _logits(self._models[idx], probe_ids)
            if not torch.is_tensor(reference) or reference.shape != logits.shape:
                raise ValueError(
                    f"reference: нужны эталонные логиты формы {tuple(logits.shape)}, "
                    f"получено {getattr(reference, 'shape', type(reference).__name__)}"
                )
            diff = (logits.float() - reference.to(logits.device).float()).abs().max()
            max_diff = float(diff)
            logits_ok = bool(math.isfinite(max_diff) and max_diff <= atol)
            if not logits_ok:
                reasons.append(f"логиты отличаются от эталона на {max_diff:.3g} > atol={atol:g}")
        ok = not reasons
        self._staging_state = "verified" if ok else "failed"
        detail = "; ".join(reasons) if reasons else "сумма и логиты совпали с эталоном"
        if max_diff is not None:
            detail += f" (max |Δ логитов| = {max_diff:.3g})"
        self.log.add(
            "verify_ok" if ok else "verify_fail",
            self.name,
            version,
            checksum=checksum,
            expected_checksum=expected_checksum,
            detail=detail,
        )
        return VerifyResult(
            self.name,
            version,
            ok,
            checksum,
            expected_checksum,
            checksum_ok,
            max_diff,
            logits_ok,
            reasons,
        )

    def ready(self) -> None:
        """Сообщает готовность к переключению (событие ready): версия записана и не провалила проверку."""
        if self._staging_state not in ("staged", "verified"):
            raise RuntimeError(
                f"реплика {self.name} не готова: подготовительный буфер {self._staging_state}"
            )
        self.log.add("ready", self.name, self.staging_version)

    def commit(self, require_verified: bool = True) -> int:
        """Атомарно делает подготовительный буфер активным (смена указателя под замком).

        require_verified=True (по умолчанию) разрешает переключение только после verify_ok.
        Запросы, начатые раньше, дочитывают старый буфер. Возвращает новую версию.
        """
        allowed = ("verified",) if require_verified else ("staged", "verified")
        if self._staging_state not in allowed:
            raise RuntimeError(
                f"реплика {self.name}: переключаться нельзя, подготовительный буфер "
                f"{self._staging_state} (нужно {' или '.join(allowed)})"
            )
        with self._lock:
            self._active = 1 - self._active
            self._staging_state = "empty"
            version, checksum = self._versions[self._active], self._checksums[self._active]
        self.log.add("commit", self.name, version, checksum=checksum, buffer="staging")
        return int(version)

    def discard_staging(self) -> None:
        """Забывает подготовленную версию (после abort): активный буфер не меняется."""
        self._staging_state = "empty"

    def corrupt_staging(self, name: str | None = None, index: int = 0, delta: float = 1.0) -> str:
        """Для опыта: портит одно число подготовительного буфера (x += delta); возвращает имя тензора."""
        if self._staging_state == "empty":
            raise RuntimeError(f"реплика {self.name}: подготовительный буфер пуст")
        buffers = self.weights("staging")
        name = self.param_names[0] if name is None else name
        if name not in buffers:
            raise ValueError(f"name: нет параметра {name!r}")
        flat = buffers[name].view(-1)
        index = integer("index", index, 0, flat.numel() - 1)
        if not is_real(delta) or delta == 0:
            raise ValueError(f"delta должно быть конечным ненулевым числом, получено {delta!r}")
        with torch.no_grad():
            flat[index] += delta
        return name

    def unsafe_update_steps(self, state_dict: Any, version: int) -> Iterator[str]:
        """СЛОМАННЫЙ режим: пишет тензоры по одному на месте в АКТИВНЫЙ буфер (yield после каждого).

        Пока идёт запись, движок продолжает заявлять старую версию; в конце метка версии
        меняется без проверки и барьера (событие commit, buffer="active").
        """
        tensors = self._source(state_dict)
        version = self._check_version(version)
        idx = self._active
        self.log.add(
            "stage_start",
            self.name,
            version,
            buffer="active",
            detail="запись на месте в активный буфер, пока идут запросы",
        )
        params = _named_params(self._models[idx])
        for name in self.param_names:
            with torch.no_grad():
                params[name].data.copy_(tensors[name])
            yield name
        checksum = self._compute_checksum(idx)
        self.log.add("stage_done", self.name, version, checksum=checksum, buffer="active")
        with self._lock:
            self._versions[idx], self._checksums[idx] = version, checksum
        self.log.add(
            "commit",
            self.name,
            version,
            checksum=checksum,
            buffer="active",
            detail="метка версии сменилась без проверки и барьера",
        )


def make_replicas(
    model: torch.nn.Module, n: int = 2, version: int = 0, log: EventLog | None = None
) -> list[InProcessEngine]:
    """n реплик ``InProcessEngine`` одной модели с общим журналом; имена replica-0, replica-1, …"""
    n = integer("n", n, 1, 16)
    log = log if log is not None else EventLog()
    return [InProcessEngine(model, version, name=f"replica-{i}", log=log) for i in range(n)]


# ----------------------------------------------------------------------------- публикатор


@dataclass
class PublishReport:
    """Итог публикации: переключились ли реплики, проверки по репликам, запросы во время неё.

    requests — по строке на запрос: request_id, replica, served_version (метка ответа),
    matches_old/matches_new (логиты побитно равны эталону старой/новой версии),
    read_consistent (прочитанное совпало с версией метки), torn (смесь версий), outcome;
    outputs — логиты этих запросов (в том же порядке).
    """

    version: int
    atomic: bool
    committed: bool
    replicas: list[str]
    verify_results: list[VerifyResult]
    requests: list[dict]
    log: EventLog
    outputs: list[torch.Tensor] = field(default_factory=list)

    @property
    def torn_reads(self) -> int:
        """Сколько запросов прочитали смесь версий."""
        return sum(bool(r["torn"]) for r in self.requests)

    def requests_frame(self):
        """Таблица pandas запросов, шедших во время публикации."""
        import pandas as pd

        cols = ["request_id", "replica", "served_version", "matches_old", "matches_new"]
        cols += ["read_consistent", "torn", "outcome"]
        return pd.DataFrame(self.requests, columns=cols)

    def verify_frame(self):
        """Таблица pandas проверок: реплика, версия, ok, checksum_ok, max_abs_diff, logits_ok."""
        import pandas as pd

        rows = [
            {
                "replica": v.replica,
                "version": v.version,
                "ok": v.ok,
                "checksum_ok": v.checksum_ok,
                "max_abs_diff": v.max_abs_diff,
                "logits_ok": v.logits_ok,
                "reasons": "; ".join(v.reasons),
            }
            for v in self.verify_results
        ]
        return pd.DataFrame(rows)

    def summary(self) -> str:
        """Одна строка по-русски: режим, версия, переключение, число смешанных чтений."""
        mode = "атомарно (двойной буфер)" if self.atomic else "на месте (без двойного буфера)"
        state = "переключены все реплики" if self.committed else "переключения нет (abort)"
        text = f"Публикация версии {self.version} {mode}: {state}"
        if self.requests:
            text += f"; запросов во время публикации: {len(self.requests)}, смесь версий: {self.torn_reads}"
        return text + "."


class Publisher:
    """Публикатор версий для реплик ``InProcessEngine`` с общим журналом.

    Атомарный протокол: запись во все подготовительные буферы → проверка каждой реплики
    (сумма + эталонные логиты на probe_ids) → ready → барьер (готовы все) → commit всех
    подряд; одна неудача — abort, не переключается никто.
    """

    def __init__(
        self,
        engines: Sequence[InProcessEngine],
        probe_ids: torch.Tensor | None = None,
        atol: float = DEFAULT_ATOL,
        name: str = PUBLISHER,
    ) -> None:
        if isinstance(engines, InProcessEngine):
            engines = [engines]
        if not isinstance(engines, Sequence) or not engines:
            raise ValueError("engines должно быть непустым списком InProcessEngine")
        if not all(isinstance(e, InProcessEngine) for e in engines):
            raise ValueError("engines: каждый элемент должен быть InProcessEngine")
        if len({e.name for e in engines}) != len(engines):
            raise ValueError("engines: имена реплик должны различаться")
        if len({id(e.log) for e in engines}) != 1:
            raise ValueError("engines должны писать в один журнал (см. make_replicas)")
        if len({tuple(e.param_names) for e in engines}) != 1:
            raise ValueError("engines: у реплик разные наборы параметров — это разные модели")
        name = text("name", name)
        self.engines = list(engines)
        self.log = engines[0].log
        self.name = name
        self.atol = nonnegative("atol", atol)
        template = engines[0]._models[engines[0]._active]
        self._reference = copy.deepcopy(template).eval().requires_grad_(False)
        if probe_ids is None:
            probe_ids = probe_input(template)
        self.probe_ids = _check_input_ids(probe_ids, engines[0].vocab_size, "probe_ids")

    def _reference_outputs(self, tensors: Mapping, inputs: Sequence[torch.Tensor]) -> list:
        """Логиты эталонной копии модели с весами tensors на каждом входе."""
        params = _named_params(self._reference)
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(tensors[name])
        return [_logits(self._reference, x) for x in inputs]

    def steps(
        self,
        state_dict: Any,
        version: int,
        atomic: bool = True,
        verify: bool = True,
        corrupt: str | None = None,
    ):
        """Генератор шагов публикации (одна единица работы на yield) — для чередования с запросами.

        corrupt — имя реплики, у которой после записи портится одно число буфера (опыт).
        Возвращает (через StopIteration.value) список VerifyResult и флаг переключения.
        """
        engines = self.engines
        tensors = engines[0]._source(state_dict)
        self._check_corrupt(corrupt, atomic)
        for e in engines:
            e._check_version(version)
        if not atomic:
            for e in engines:
                yield from e.unsafe_update_steps(tensors, version)
            return [], True
        expected = engines[0].expected_checksum(tensors)
        ref = self._reference_outputs(tensors, [self.probe_ids])[0]
        for e in engines:
            yield from e.stage_steps(tensors, version)
            if e.name == corrupt:
                e.corrupt_staging()
        results = []
        for e in engines:
            if verify:
                results.append(e.verify(expected, self.probe_ids, ref, self.atol))
            yield f"verify {e.name}"
        ready = [e for e, r in zip(engines, results or [None] * len(engines)) if r is None or r.ok]
        for e in ready:
            e.ready()
        if len(ready) == len(engines):
            self.log.add(
                "barrier", self.name, version, detail=f"готовы все реплики: {len(engines)}"
            )
            for e in engines:  # подряд, без запросов между ними
                e.commit(require_verified=verify)
            return results, True
        failed = ", ".join(e.name for e in engines if e not in ready)
        self.log.add("abort", self.name, version, detail=f"не прошли проверку: {failed}")
        for e in engines:
            e.discard_staging()
        return results, False

    def publish(
        self,
        state_dict: Any,
        version: int,
        atomic: bool = True,
        verify: bool = True,
        requests: Sequence[torch.Tensor] | None = None,
        steps_per_layer: int | None = None,
        corrupt: str | None = None,
    ) -> PublishReport:
        """Публикует версию; requests — входы запросов, которые идут во время публикации.

        Запрос i обслуживает реплика i mod n; между слоями каждого запроса публикатор делает
        steps_per_layer шагов (по умолчанию столько, чтобы публикация закончилась к середине
        списка запросов). Ответ каждого запроса сравнивается побитно с эталонами старой и новой
        версии и проверяется по сумме прочитанных весов; смесь — событие torn_read.
        corrupt — имя реплики, которой после записи портится одно число (ждём verify_fail и abort).
        """
        version = integer("version", version, 0)
        flag("atomic", atomic)
        flag("verify", verify)
        if requests is None:
            requests = []
        if torch.is_tensor(requests) or not isinstance(requests, Sequence | Iterator):
            raise ValueError(
                "requests должно быть списком тензоров-входов (по одному на запрос) или None, "
                f"получено {type(requests).__name__}"
            )
        inputs = [_check_input_ids(x, self.engines[0].vocab_size, "requests") for x in requests]
        steps_per_layer = optional_integer("steps_per_layer", steps_per_layer, 1)
        for e in self.engines:
            e._check_version(version)
        self._check_corrupt(corrupt, atomic)
        tensors = self.engines[0]._source(state_dict)
        n = len(self.engines)
        old_refs: list = [None] * len(inputs)
        new_refs: list = []
        if inputs:
            for k, e in enumerate(self.engines):
                mine = [i for i in range(len(inputs)) if i % n == k]
                outs = self._reference_outputs(e.weights("active"), [inputs[i] for i in mine])
                for i, out in zip(mine, outs):
                    old_refs[i] = out
            new_refs = self._reference_outputs(tensors, inputs)
        gen = self.steps(tensors, version, atomic=atomic, verify=verify, corrupt=corrupt)
        state: dict[str, Any] = {"done": False, "value": ([], False)}

        def advance(k: int) -> None:
            for _ in range(k):
                if state["done"]:
                    return
                try:
                    next(gen)
                except StopIteration as stop:
                    state["done"], state["value"] = True, stop.value

        rows, outputs = [], []
        if inputs:
            n_params = len(self.engines[0].param_names)
            total = n * n_params + (n if atomic else 0) + 1
            hooks = len(_decoder_layers(self.engines[0]._models[0]))
            if steps_per_layer is None:
                busy = max(1, math.ceil(len(inputs) / 2))
                steps_per_layer = max(1, math.ceil(total / (hooks * busy)))
            for i, x in enumerate(inputs):
                engine = self.engines[i % n]
                res = engine.forward(
                    x,
                    request_id=f"{engine.name}/v{version}-req-{i}",
                    between_layers=lambda _i: advance(steps_per_layer),
                    track_reads=True,
                )
                rows.append(self._check_request(res, old_refs[i], new_refs[i]))
                outputs.append(res.logits)
        advance(10**9)
        verify_results, committed = state["value"]
        return PublishReport(
            version=int(version),
            atomic=atomic,
            committed=bool(committed),
            replicas=[e.name for e in self.engines],
            verify_results=list(verify_results),
            requests=rows,
            log=self.log,
            outputs=outputs,
        )

    def _check_corrupt(self, corrupt: Any, atomic: bool) -> None:
        if corrupt is None:
            return
        names = [e.name for e in self.engines]
        if corrupt not in names:
            raise ValueError(
                f"corrupt должно быть именем реплики из {names} или None, получено {corrupt!r}"
            )
        if not atomic:
            raise ValueError(
                "corrupt работает только с atomic=True (порча подготовительного буфера)"
            )

    def _check_request(self, res: ServeResult, old_ref, new_ref) -> dict:
        matches_old = bool(torch.equal(res.logits, old_ref))
        matches_new = bool(torch.equal(res.logits, new_ref))
        torn = not res.read_consistent or not (matches_old or matches_new)
        if torn:
            outcome = "смесь версий"
            self.log.add(
                "torn_read",
                res.replica,
                res.version,
                checksum=res.read_checksum,
                request_id=res.request_id,
                detail=(
                    f"ответ помечен версией {res.version}, но прочитанные веса "
                    f"({_short_checksum(res.read_checksum)}) не равны ни одной версии; логиты не совпали "
                    "ни со старым, ни с новым эталоном"
                    if not (matches_old or matches_new)
                    else f"ответ помечен версией {res.version}, а прочитаны веса другой версии"
                ),
            )
        else:
            outcome = "старые веса" if matches_old else "новые веса"
        return {
            "request_id": res.request_id,
            "replica": res.replica,
            "served_version": res.version,
            "matches_old": matches_old,
            "matches_new": matches_new,
            "read_consistent": bool(res.read_consistent),
            "torn": torn,
            "outcome": outcome,
        }


def publish(
    engines: Sequence[InProcessEngine],
    state_dict: Any,
    version: int,
    verify: bool = True,
    atomic: bool = True,
    probe_ids: torch.Tensor | None = None,
    atol: float = DEFAULT_ATOL,
    requests: Sequence[torch.Tensor] | None = None,
    steps_per_layer: int | None = None,
    corrupt: str | None = None,
) -> PublishReport:
    """Публикует state_dict версии version на все реплики (см. ``Publisher.publish``).

    atomic=True — двойной буфер, проверка, барьер, переключение всех; atomic=False —
    сломанный режим: запись на месте в активный буфер, пока идут запросы.
    """
    pub = Publisher(engines, probe_ids=probe_ids, atol=atol)
    return pub.publish(
        state_dict,
        version,
        atomic=atomic,
        verify=verify,
        requests=requests,
        steps_per_layer=steps_per_layer,
        corrupt=corrupt,
    )


# ----------------------------------------------------------------------------- аудит журнала


def _as_events(events: Any) -> list[dict]:
    if isinstance(events, EventLog):
        return events.to_list()
    if hasattr(events, "to_dict") and hasattr(events, "columns"):  # pandas.DataFrame
        events = events.to_dict("records")
    if isinstance(events, str | bytes) or not isinstance(events, Sequence):
        raise ValueError(
            "events должно быть списком словарей-событий, EventLog или таблицей pandas, "
            f"получено {type(events).__name__}"
        )
    return [e for e in events]


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _normalise(events: Any) -> list[dict]:
    out = []
    for i, raw in enumerate(_as_events(events)):
        if not isinstance(raw, Mapping):
            raise ValueError(f"events[{i}] должно быть словарём, получено {type(raw).__name__}")
        ev = {k: _clean(v) for k, v in raw.items()}
        kind = ev.get("event")
        if not isinstance(kind, str) or kind not in EVENT_TYPES:
            raise ValueError(
                f"events[{i}]: поле event должно быть одним из {sorted(EVENT_TYPES)}, получено {kind!r}"
            )
        if not isinstance(ev.get("replica"), str) or not ev["replica"]:
            raise ValueError(f"events[{i}]: поле replica должно быть непустой строкой")
        version = ev.get("version")
        if is_count(version) and version >= 0:
            ev["version"] = int(version)
        else:
            raise ValueError(
                f"events[{i}] ({kind}): поле version должно быть целым ≥ 0, получено {version!r}"
            )
        t = ev.get("t")
        if t is not None and not is_real(t):
            raise ValueError(f"events[{i}]: поле t должно быть числом секунд, получено {t!r}")
        ev["_pos"] = i
        out.append(ev)
    if out and all(e.get("t") is not None for e in out):
        out.sort(key=lambda e: e["t"])  # устойчиво: равные времена — в порядке списка
    return out


def russian(frame):
    """Копия таблицы pandas для показа студенту: русские заголовки (``COLUMN_NAMES``), целые
    от 10 000 — с разрядами через неразрывный пробел (``fmt.num``: 4 000 000, а не 4000000)."""
    from course_utils.fmt import num

    out = frame.rename(columns=COLUMN_NAMES)
    for col in out.columns:
        values = out[col]
        if values.dtype.kind in "iu" and len(values) and values.abs().max() >= 10_000:
            out[col] = values.map(num)
    return out


def audit_log(events: Any) -> list[str]:
    """Нарушения протокола публикации весов в журнале (пустой список — журнал чистый).

    events — список словарей со схемой ``EVENT_FIELDS`` (обязательны event, replica, version),
    ``EventLog`` или таблица pandas. Если у всех событий есть t, они упорядочиваются по t
    (журналы нескольких процессов одной машины), иначе берётся порядок списка. Правила —
    ``AUDIT_RULES``; каждое сообщение начинается с кода правила в квадратных скобках и
    пишется один раз на (правило, реплика, версия). Участники версии v — реплики с событиями
    stage_*/verify_*/ready/commit для v; барьер v пройден, когда ready прислали все участники
    (и, если в журнале есть события barrier для v, после первого из них).
    """
    evs = _normalise(events)
    participants: dict[int, set[str]] = {}
    has_barrier: set[int] = set()
    ref_checksum: dict[int, str] = {}
    for ev in evs:
        v = ev["version"]
        if ev["event"] in _REPLICA_EVENTS:
            participants.setdefault(v, set()).add(ev["replica"])
        if ev["event"] == "barrier":
            has_barrier.add(v)
        if ev["event"] in ("verify_ok", "verify_fail") and ev.get("expected_checksum"):
            ref_checksum.setdefault(v, ev["expected_checksum"])
    for ev in evs:  # без присланной суммы эталон — первая сумма переключения (или init)
        if ev["event"] in ("commit", "init") and ev.get("checksum"):
            ref_checksum.setdefault(ev["version"], ev["checksum"])

    messages: dict[tuple, str] = {}

    def report(code: str, replica: str, version: int, text: str, key: Any = None) -> None:
        messages.setdefault((code, replica, version, key), f"[{code}] {text}")

    current: dict[str, int] = {}
    initial: dict[str, int] = {}
    switched: set[int] = set()  # версии, на которые переключилась хотя бы одна реплика
    ready: dict[int, set[str]] = {}
    barrier_passed: set[int] = set()
    verified: dict[tuple[str, int], str | None] = {}

    def not_ready(v: int) -> list[str]:
        return sorted(participants.get(v, set()) - ready.get(v, set()))

    def barrier_missing(v: int) -> str:
        waiting = not_ready(v)
        if waiting:
            return f"не сообщили ready: {', '.join(waiting)}"
        if v in has_barrier and v not in barrier_passed:
            return "событие barrier ещё не записано"
        return ""

    for ev in evs:
        kind, r, v = ev["event"], ev["replica"], ev["version"]
        where = f"событие №{ev['_pos']} ({kind})"
        checksum = ev.get("checksum")
        if kind == "init":
            initial.setdefault(r, v)
            current[r] = v
        elif kind == "stage_start":
            verified[(r, v)] = None
            if ev.get("buffer") == "active":
                report(
                    "inplace_update",
                    r,
                    v,
                    f"реплика {r} пишет версию {v} на месте в активный буфер ({where}): "
                    "запросы могут прочитать смесь версий — нужен второй буфер",
                )
        elif kind in ("verify_ok", "verify_fail"):
            verified[(r, v)] = "ok" if kind == "verify_ok" else "fail"
            expected = ev.get("expected_checksum")
            if kind == "verify_ok" and checksum and expected and checksum != expected:
                report(
                    "checksum_mismatch",
                    r,
                    v,
                    f"реплика {r}, версия {v}: verify_ok, но сумма {_short_checksum(checksum)} ≠ "
                    f"ожидаемой {_short_checksum(expected)} ({where})",
                )
        elif kind == "ready":
            ready.setdefault(v, set()).add(r)
        elif kind == "barrier":
            waiting = not_ready(v)
            if waiting:
                report(
                    "barrier_not_ready",
                    r,
                    v,
                    f"барьер версии {v} отмечен пройденным ({where}), а ready не прислали: "
                    f"{', '.join(waiting)}",
                )
            barrier_passed.add(v)
        elif kind == "commit":
            missing = barrier_missing(v)
            if missing:
                report(
                    "commit_before_barrier",
                    r,
                    v,
                    f"реплика {r} переключилась на версию {v} до барьера готовности ({missing}; {where})",
                )
            state = verified.get((r, v))
            if state != "ok":
                why = "последняя проверка — verify_fail" if state == "fail" else "проверки не было"
                report(
                    "commit_without_verify",
                    r,
                    v,
                    f"реплика {r} переключилась на версию {v} без verify_ok ({why}; {where})",
                )
            if r in current and v < current[r]:
                report(
                    "version_backwards",
                    r,
                    v,
                    f"реплика {r} переключилась назад: {current[r]} → {v} ({where})",
                )
            ref = ref_checksum.get(v)
            if checksum and ref and checksum != ref:
                report(
                    "checksum_mismatch",
                    r,
                    v,
                    f"реплика {r} переключилась на версию {v} с суммой {_short_checksum(checksum)}, "
                    f"эталон версии — {_short_checksum(ref)} ({where})",
                )
            current[r] = v
            switched.add(v)
        elif kind == "serve":
            if r not in current:
                initial.setdefault(r, v)
                current[r] = v
            cur = current[r]
            if v != initial.get(r):
                missing = barrier_missing(v)
                if missing:
                    report(
                        "serve_before_barrier",
                        r,
                        v,
                        f"реплика {r} обслуживает версию {v} до барьера готовности ({missing}; {where})",
                    )
            if v < cur:
                report(
                    "version_backwards",
                    r,
                    v,
                    f"реплика {r} обслуживает версию {v}, хотя уже переключилась на {cur} ({where})",
                )
            elif v > cur:
                report(
                    "serve_uncommitted",
                    r,
                    v,
                    f"реплика {r} обслуживает версию {v}, а переключалась только на {cur} ({where})",
                )
            # Расхождение — только после переключения на более новую из двух версий: запрос
            # из staging до любого commit — это serve_uncommitted, а не разошедшиеся реплики.
            others = {
                o: w for o, w in current.items() if o != r and w != v and max(w, v) in switched
            }
            if others:
                listed = ", ".join(f"{o}: {w}" for o, w in sorted(others.items()))
                report(
                    "replicas_diverged",
                    r,
                    v,
                    f"реплика {r} обслуживает версию {v}, а другие реплики — {listed} ({where})",
                )
            ref = ref_checksum.get(v)
            if checksum and ref and checksum != ref:
                report(
                    "checksum_mismatch",
                    r,
                    v,
                    f"реплика {r} обслуживает версию {v} с суммой {_short_checksum(checksum)}, "
                    f"эталон версии — {_short_checksum(ref)} ({where})",
                )
        elif kind == "torn_read":
            rid = ev.get("request_id")
            report(
                "torn_read",
                r,
                v,
                f"запрос {rid} на реплике {r} помечен версией {v}, но прочитал смесь версий ({where})",
                key=rid,
            )
    return list(messages.values())
