"""Уровень C: роли RL-цикла как настоящие процессы ОС под ``torch.distributed``.

Точки входа запускаются через ``multiproc.launch("course_utils.rl_procs:<функция>", ...)``
или без изменений под ``torchrun``; каждая возвращает JSON-словарь с замерами.

Урок 12.1 — ``sync_generator_trainer``: генератор (ранг 0) и тренер (ранг 1) в разных
процессах, но алгоритм строго синхронный. Генератор собирает пакет роллаутов версией v и
отправляет его тренеру; тренер проверяет записи, пересчитывает старые логарифмы
вероятностей, делает шаг GRPO и отправляет веса версии v+1; генератор ждёт именно v+1 и
только затем собирает следующий пакет. Поэтому задержка политики L = u − v равна 0 на
каждом шаге, а пока один процесс работает, другой ждёт: размещение раздельное,
синхронность сохранена. ``sync_steps_frame`` и ``events_frame`` превращают результат запуска
в таблицы для ноутбука (вторая — для ``tracing.gantt``).

Урок 12.3 — ``queue_generators_trainer``: тренер (ранг 0) владеет очередью роллаутов с
порогом в токенах, два генератора (ранги 1 и 2) перед каждым запросом спрашивают у него
разрешение. Порог останавливает начало новой работы, но не уже начатые запросы, поэтому
глубина очереди может превысить порог на работу «в полёте»; при λ > μ генераторы
получают отказы (обратное давление), при λ < μ тренер ждёт данные. ``queue_timeline_frame``,
``queue_batches_frame``, ``queue_requests_frame``, ``queue_summary`` и ``events_frame``
превращают результат запуска в таблицы.

Обмен между рангами — небольшие помощники поверх ``dist.send``/``dist.recv``:

* ``send_object``/``recv_object`` — JSON-объект: длина (int64), затем байты UTF-8 (uint8).
  JSON, а не pickle: получатель не исполняет чужой код, а записи роллаутов и так
  JSON-сериализуемы (контракт 12.1.2);
* ``send_tensors``/``recv_tensors`` — именованные тензоры (веса): заголовок-объект с
  метаданными (версия, имена, формы, типы), затем по одному ``dist.send`` на тензор;
* ``state_checksum`` — SHA-256 байтов тензоров: обе стороны сравнивают веса точно.

На NCCL тензоры должны лежать на GPU своего ранга (``multiproc.local_device``), на gloo — на
CPU. Время — ``time.perf_counter`` (с синхронизацией CUDA на GPU). События для диаграммы Ганта
хранят начало по настенным часам ``time.time()`` относительно общей точки отсчёта, которую
ранг 0 рассылает в начале: так события двух процессов ложатся на одну ось. Настенные часы
разных машин согласованы лишь с точностью синхронизации NTP (миллисекунды и хуже), поэтому
общую диаграмму честно рисовать только для процессов на одной машине.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from course_utils.args import flag, integer, is_int, nonnegative, positive, text

GENERATOR_RANK = 0
TRAINER_RANK = 1
ROLE_GENERATOR = "генератор"
ROLE_TRAINER = "тренер"
CLOCK_NOTE = (
    "start_s/end_s событий — секунды настенных часов time.time() от общей точки отсчёта "
    "(её рассылает ранг 0); события разных процессов сравнимы только на одной машине"
)

__all__ = [
    "GENERATOR_RANK",
    "TRAINER_RANK",
    "ROLE_GENERATOR",
    "ROLE_TRAINER",
    "CLOCK_NOTE",
    "STAGE_KINDS_RU",
    "SYNC_STEP_COLUMNS_RU",
    "RecvStats",
    "send_object",
    "recv_object",
    "send_tensors",
    "recv_tensors",
    "state_checksum",
    "sync_generator_trainer",
    "sync_steps_frame",
    "events_frame",
    "QUEUE_EXPERIMENT",
    "QUEUE_TRAINER_RANK",
    "QUEUE_GENERATOR_RANKS",
    "WORKER_QUEUE_RU",
    "QUEUE_RETRY_S",
    "QUEUE_SUMMARY_RU",
    "rollout_tokens",
    "queue_generators_trainer",
    "queue_timeline_frame",
    "queue_batches_frame",
    "queue_requests_frame",
    "queue_summary",
    "queue_summary_text",
]


# ----------------------------------------------------------------------------- обмен между рангами


@dataclass
class RecvStats:
    """Замер одного приёма: байты полезной нагрузки и время, с.

    wait_s — ожидание первого сообщения (отправитель ещё не начал отправку: процесс простаивал),
    transfer_s — приём остального после того, как отправка началась.
    """

    nbytes: int
    wait_s: float
    transfer_s: float


def _check_peer(name: str, peer: Any) -> int:
    """Проверяет номер ранга-собеседника: группа создана, 0 ≤ peer < world_size, peer ≠ свой."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed не инициализирован: функцию вызывают внутри процесса, "
            "запущенного multiproc.launch или torchrun"
        )
    world, me = dist.get_world_size(), dist.get_rank()
    if not is_int(peer) or not 0 <= peer < world:
        raise ValueError(f"{name} должно быть целым в [0, {world - 1}], получено {peer!r}")
    if peer == me:
        raise ValueError(f"{name}={peer} совпадает с собственным рангом: отправить себе нельзя")
    return int(peer)


def _device(device: Any):
    import torch

    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: не понимаю устройство {device!r}") from exc


def device_sync(device) -> None:
    """Ждёт завершения работы CUDA на device (до замера времени); на CPU ничего не делает."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def send_object(obj: Any, dst: int, device: Any = "cpu", group: Any = None) -> int:
    """Отправляет JSON-сериализуемый объект рангу dst; возвращает размер полезной нагрузки, байт.

    Два сообщения: длина n (один int64), затем n байт UTF-8 (uint8) на устройстве device
    (на NCCL — GPU своего ранга). Получатель вызывает ``recv_object(src=<этот ранг>)``.
    group — группа процессов (None — основная); dst — глобальный номер ранга.
    """
    import torch
    import torch.distributed as dist

    dst = _check_peer("dst", dst)
    dev = _device(device)
    try:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"obj должен быть JSON-сериализуемым: {exc}") from exc
    dist.send(torch.tensor([len(data)], dtype=torch.int64, device=dev), dst=dst, group=group)
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
    dist.send(payload, dst=dst, group=group)
    device_sync(dev)
    return len(data)


def recv_object(src: int, device: Any = "cpu", group: Any = None) -> tuple[Any, RecvStats]:
    """Принимает объект от ``send_object`` ранга src. Возвращает (объект, RecvStats).

    wait_s — время до прихода длины (блокировка: отправитель ещё не готов), transfer_s —
    приём байтов и разбор JSON, секунды. group — как в ``send_object``.
    """
    import torch
    import torch.distributed as dist

    src = _check_peer("src", src)
    dev = _device(device)
    t0 = time.perf_counter()
    size = torch.zeros(1, dtype=torch.int64, device=dev)
    dist.recv(size, src=src, group=group)
    n = int(size.item())  # .item() ждёт данные и на GPU
    t1 = time.perf_counter()
    payload = torch.empty(n, dtype=torch.uint8, device=dev)
    dist.recv(payload, src=src, group=group)
    obj = json.loads(payload.cpu().numpy().tobytes().decode("utf-8"))
    t2 = time.perf_counter()
    return obj, RecvStats(nbytes=n, wait_s=t1 - t0, transfer_s=t2 - t1)


def _named(tensors: Any, name: str) -> dict:
    """Словарь имя → тензор из модели (named_parameters) или отображения."""
    import torch

    if isinstance(tensors, torch.nn.Module):
        return dict(tensors.named_parameters())
    if isinstance(tensors, Mapping) and tensors:
        bad = [k for k, v in tensors.items() if not isinstance(k, str) or not torch.is_tensor(v)]
        if bad:
            raise ValueError(f"{name}: нужны пары «строка → тензор», плохие ключи: {bad[:5]}")
        return dict(tensors)
    raise ValueError(
        f"{name} должно быть моделью torch.nn.Module или непустым словарём «имя → тензор», "
        f"получено {type(tensors).__name__}"
    )


def _dtype(name: str, value: Any):
    import torch

    if value is None:
        return None
    dt = getattr(torch, value, None) if isinstance(value, str) else value
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"{name}: неизвестный тип тензора {value!r}")
    return dt


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def send_tensors(
    tensors: Any,
    dst: int,
    device: Any = "cpu",
    meta: Mapping | None = None,
    wire_dtype: Any = None,
) -> int:
    """Отправляет именованные тензоры рангу dst; возвращает байты тензоров (без заголовка).

    Сначала заголовок ``send_object``: meta (например, версия весов), имена, формы и типы,
    затем по одному ``dist.send`` на тензор (в типе wire_dtype, если задан, — например,
    bfloat16 движка вместо fp32 тренера). Байты = Σ numel · element_size(wire_dtype).
    tensors — модель (берутся named_parameters) или словарь «имя → тензор».
    """
    import torch
    import torch.distributed as dist

    named = _named(tensors, "tensors")
    dst = _check_peer("dst", dst)
    dev = _device(device)
    wire = _dtype("wire_dtype", wire_dtype)
    if meta is not None and not isinstance(meta, Mapping):
        raise ValueError(f"meta должно быть словарём или None, получено {type(meta).__name__}")
    specs = []
    for name, t in named.items():
        dt = wire or t.dtype
        specs.append([name, list(t.shape), _dtype_name(dt)])
    total = sum(
        math.prod(shape) * torch.empty(0, dtype=_dtype("dtype", dt)).element_size()
        for _, shape, dt in specs
    )
    send_object({"meta": dict(meta or {}), "tensors": specs, "nbytes": total}, dst, dev)
    with torch.no_grad():
        for t in named.values():
            dist.send(t.detach().to(device=dev, dtype=wire or t.dtype).contiguous(), dst=dst)
    device_sync(dev)
    return int(total)


def recv_tensors(
    src: int, device: Any = "cpu", buffers: Mapping | None = None
) -> tuple[dict, dict, RecvStats]:
    """Принимает тензоры от ``send_tensors``. Возвращает (meta, {имя: тензор}, RecvStats).

    buffers — готовые буферы приёма (например, от прошлого вызова): имена, формы и типы
    обязаны совпасть с заголовком, иначе ValueError; без них буферы создаются на device.
    RecvStats.wait_s — ожидание заголовка, transfer_s — приём заголовка и всех тензоров, с.
    """
    import torch
    import torch.distributed as dist

    src = _check_peer("src", src)
    dev = _device(device)
    header, head_stats = recv_object(src, dev)
    t0 = time.perf_counter()
    specs = header["tensors"]
    if buffers is None:
        out = {
            name: torch.empty(shape, dtype=_dtype("dtype", dt), device=dev)
            for name, shape, dt in specs
        }
    else:
        out = _named(buffers, "buffers")
        expected = [[n, list(t.shape), _dtype_name(t.dtype)] for n, t in out.items()]
        if sorted(expected) != sorted(specs):
            raise ValueError(
                "buffers: имена, формы или типы буферов не совпадают с заголовком отправителя"
            )
    for name, _, _ in specs:
        dist.recv(out[name], src=src)
    device_sync(dev)
    stats = RecvStats(
        nbytes=int(header["nbytes"]),
        wait_s=head_stats.wait_s,
        transfer_s=head_stats.transfer_s + time.perf_counter() - t0,
    )
    return dict(header["meta"]), out, stats


def state_checksum(tensors: Any, dtype: Any = None) -> str:
    """SHA-256 (hex) имён, форм, типов и байтов тензоров в порядке имён; dtype — привести тип.

    tensors — модель (named_parameters) или словарь «имя → тензор». Равные суммы — побитно
    равные веса; ``dtype`` нужен, чтобы сравнить fp32-веса тренера с bf16-копией движка.
    Тензоры копируются на CPU: для модели в 1 ГБ это ~1 с.
    """
    import torch

    named = _named(tensors, "tensors")
    dt = _dtype("dtype", dtype)
    h = hashlib.sha256()
    with torch.no_grad():
        for name in sorted(named):
            t = named[name].detach()
            t = (t.to(dt) if dt is not None else t).contiguous().cpu()
            h.update(f"{name}|{list(t.shape)}|{_dtype_name(t.dtype)}\n".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------- замер этапов


class _Span:
    duration_s = 0.0


class _Stages:
    """События этапов одного процесса: длительность — perf_counter, начало — time.time()."""

    def __init__(self, t_ref: float, device) -> None:
        self.t_ref = t_ref
        self.device = device
        self.events: list[dict] = []

    def add(
        self,
        stage: str,
        step: int | None,
        wall_start: float,
        duration_s: float,
        worker: str | None = None,
    ) -> None:
        start = wall_start - self.t_ref
        event = {"stage": stage, "step": step, "start_s": start, "end_s": start + duration_s}
        if worker is not None:  # своя строка диаграммы Ганта (например, поток очереди)
            event["worker"] = worker
        self.events.append(event)  # list.append атомарен: события пишут и два потока

    @contextlib.contextmanager
    def stage(
        self, stage: str, step: int | None = None, worker: str | None = None
    ) -> Iterator[_Span]:
        span = _Span()
        device_sync(self.device)
        wall0, t0 = time.time(), time.perf_counter()
        try:
            yield span
        finally:
            device_sync(self.device)
            span.duration_s = time.perf_counter() - t0
            self.add(stage, step, wall0, span.duration_s, worker)


def shared_time_ref(device) -> float:
    """Общая точка отсчёта времени: time.time() ранга 0, разосланная всем (broadcast), с."""
    import torch
    import torch.distributed as dist

    ref = torch.tensor([time.time()], dtype=torch.float64, device=device)
    dist.broadcast(ref, src=0)
    return float(ref.item())


# ----------------------------------------------------------------------------- урок 12.1


def _behavior_version(records) -> int:
    versions = {r.policy_version for r in records}
    if len(versions) != 1:
        raise RuntimeError(
            f"в одном пакете роллаутов несколько версий политики: {sorted(versions)}"
        )
    return int(versions.pop())


def _reward_mean(records) -> float:
    from course_utils.policy import scalar_reward

    return sum(scalar_reward(r.reward) for r in records) / len(records)


def sync_generator_trainer(
    rank: int,
    world_size: int,
    backend: str,
    steps: int = 3,
    prompts_per_step: int = 4,
    group_size: int = 4,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    lr: float = 1e-5,
    seed: int = 0,
    model: str = "tiny",
    verify: bool = True,
) -> dict:
    """Синхронный RL-цикл в двух процессах: ранг 0 — генератор, ранг 1 — тренер (world_size = 2).

    Шаг k: генератор собирает prompts_per_step · group_size роллаутов версией v и отправляет
    их тренеру; тренер проверяет записи (``validate_rollout``), пересчитывает старые
    log-вероятности, делает ``grpo_step`` (fp32-копия, AdamW), версия становится v+1, и веса
    уходят генератору; генератор ждёт ровно v+1, загружает веса и только тогда начинает
    шаг k+1. Задержка L = u − v (u — версия тренера перед обновлением) равна 0 на каждом шаге.
    verify=True: обе стороны сверяют SHA-256 весов (в начале и после каждой передачи).

    Времена в секундах (perf_counter): generate_s, send_s, wait_s (процесс заблокирован в
    ожидании другой стороны), weight_recv_s/weight_send_s, train_s = logprob_s + update_s;
    байты — weight_bytes (веса в типе движка), rollout_bytes (JSON записей).
    Возвращает словарь: role, pid, device, model, steps (строка на шаг), events
    (для диаграммы Ганта, см. ``CLOCK_NOTE``), weights_checksum итоговых весов и др.
    """
    if world_size != 2:
        raise ValueError(
            f"sync_generator_trainer: нужно ровно 2 процесса (ранг {GENERATOR_RANK} — генератор, "
            f"ранг {TRAINER_RANK} — тренер), а world_size={world_size}; запустите nprocs=2"
        )
    steps, seed = integer("steps", steps, 1), integer("seed", seed, 0)
    prompts_per_step = integer("prompts_per_step", prompts_per_step, 1)
    group_size = integer("group_size", group_size, 1)
    max_new_tokens = integer("max_new_tokens", max_new_tokens, 1)
    lr, temperature = positive("lr", lr), positive("temperature", temperature)
    verify = flag("verify", verify)
    model = text("model", model)
    if rank not in (GENERATOR_RANK, TRAINER_RANK):
        raise ValueError(f"rank должно быть 0 (генератор) или 1 (тренер), получено {rank!r}")

    import torch

    from course_utils.multiproc import local_device
    from course_utils.policy import load_policy

    device = local_device(backend)
    t_ref = shared_time_ref(device)
    stages = _Stages(t_ref, device)
    torch.manual_seed(seed)
    with stages.stage("load_model"):
        net, tokenizer, info = load_policy(model, device=device)
    common = {
        "rank": rank,
        "world_size": world_size,
        "backend": backend,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "device": str(device),
        "model": info.describe(),
        "model_id": info.model_id,
        "num_params": info.num_params,
        "engine_dtype": info.dtype,
        "t_ref_unix": t_ref,
        "clock_note": CLOCK_NOTE,
    }
    run = _run_generator if rank == GENERATOR_RANK else _run_trainer
    out = run(
        net,
        tokenizer,
        info,
        device,
        stages,
        steps=steps,
        prompts_per_step=prompts_per_step,
        group_size=group_size,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        lr=lr,
        seed=seed,
        verify=verify,
    )
    return {**common, **out, "events": stages.events}


def _run_generator(net, tokenizer, info, device, stages, *, verify, **cfg) -> dict:
    import torch

    from course_utils.policy import generate_rollouts, make_tasks

    engine = net.eval()
    with stages.stage("handshake"):
        hello = {
            "model_id": info.model_id,
            "num_params": info.num_params,
            "dtype": info.dtype,
            "checksum": state_checksum(engine) if verify else None,
        }
        send_object(hello, TRAINER_RANK, device)
    version, rows, staging = 0, [], None
    for step in range(cfg["steps"]):
        step_t0 = time.perf_counter()
        step_seed = cfg["seed"] * 1000 + step
        tasks = make_tasks(cfg["prompts_per_step"], seed=step_seed)
        with stages.stage("generate", step) as gen:
            batch = generate_rollouts(
                engine,
                tokenizer,
                tasks,
                group_size=cfg["group_size"],
                temperature=cfg["temperature"],
                max_new_tokens=cfg["max_new_tokens"],
                policy_version=version,
                seed=step_seed,
                run_id=f"sync{cfg['seed']}",
            )
        behavior = _behavior_version(batch.records)
        payload = {"step": step, "records": [r.to_dict() for r in batch.records]}
        with stages.stage("send_rollouts", step) as snd:
            rollout_bytes = send_object(payload, TRAINER_RANK, device)

        # Блокируемся, пока тренер не пришлёт веса: это и есть ожидание синхронного цикла.
        wall0 = time.time()
        meta, staging, rs = recv_tensors(TRAINER_RANK, device, staging)
        stages.add("wait_weights", step, wall0, rs.wait_s)
        stages.add("recv_weights", step, wall0 + rs.wait_s, rs.transfer_s)
        if meta.get("version") != version + 1:
            raise RuntimeError(
                f"генератор: после пакета версии {version} ожидались веса версии {version + 1}, "
                f"получена версия {meta.get('version')!r} — синхронный протокол нарушен"
            )
        verify_s = 0.0
        if verify:
            with stages.stage("verify_weights", step) as ver:
                if state_checksum(staging) != meta.get("checksum"):
                    raise RuntimeError(
                        f"генератор: контрольная сумма весов версии {version + 1} не совпала "
                        f"с суммой тренера — веса повреждены при передаче"
                    )
            verify_s = ver.duration_s
        with stages.stage("load_weights", step) as load, torch.no_grad():
            params = dict(engine.named_parameters())
            for name, buf in staging.items():
                params[name].copy_(buf)
        trained_from = int(meta["trained_from_version"])
        rows.append(
            {
                "step": step,
                "behavior_version": behavior,
                "trainer_version_before_update": trained_from,
                "lag": trained_from - behavior,
                "received_version": int(meta["version"]),
                "generate_s": gen.duration_s,
                "send_s": snd.duration_s,
                "wait_s": rs.wait_s,
                "weight_recv_s": rs.transfer_s,
                "verify_s": verify_s,
                "load_s": load.duration_s,
                "step_s": time.perf_counter() - step_t0,
                "rollout_bytes": rollout_bytes,
                "weight_bytes": rs.nbytes,
                "n_records": len(batch.records),
                "output_tokens": batch.output_tokens,
                "reward_mean": _reward_mean(batch.records),
            }
        )
        version = int(meta["version"])
    return {
        "role": ROLE_GENERATOR,
        "steps": rows,
        "final_version": version,
        "total_wait_s": sum(r["wait_s"] for r in rows),
        "weights_checksum": state_checksum(engine),
    }


def _run_trainer(net, tokenizer, info, device, stages, *, verify, **cfg) -> dict:
    import torch

    from course_utils.contract import RolloutRecord, validate_rollout
    from course_utils.policy import (
        grad_scaler_for,
        grpo_step,
        recompute_logprobs,
        trainer_autocast_dtype,
    )

    wire_dtype = next(net.parameters()).dtype  # веса уходят движку в его типе
    trainer = net.float()
    amp = trainer_autocast_dtype(device, wire_dtype)
    scaler = grad_scaler_for(device, amp)  # float16 на T4: масштаб потерь GradScaler
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=cfg["lr"])

    with stages.stage("handshake"):
        hello, _ = recv_object(GENERATOR_RANK, device)
        mine = {"model_id": info.model_id, "num_params": info.num_params, "dtype": info.dtype}
        theirs = {k: hello.get(k) for k in mine}
        if theirs != mine:
            raise RuntimeError(f"тренер: у генератора другая модель: {theirs}, у тренера {mine}")
        if verify and hello["checksum"] != state_checksum(trainer, dtype=wire_dtype):
            raise RuntimeError("тренер: начальные веса генератора и тренера (версия 0) различаются")

    version, rows = 0, []
    for step in range(cfg["steps"]):
        step_t0 = time.perf_counter()
        wall0 = time.time()
        payload, rs = recv_object(GENERATOR_RANK, device)
        stages.add("wait_rollouts", step, wall0, rs.wait_s)
        stages.add("recv_rollouts", step, wall0 + rs.wait_s, rs.transfer_s)
        with stages.stage("validate", step) as val:
            problems = []
            for i, d in enumerate(payload["records"]):
                problems += [f"запись {i}: {p}" for p in validate_rollout(d)]
            if problems:
                raise ValueError(
                    "тренер: пакет роллаутов нарушает контракт:\n" + "\n".join(problems[:10])
                )
            records = [RolloutRecord.from_dict(d) for d in payload["records"]]
        behavior = _behavior_version(records)
        if version - behavior != 0:
            raise RuntimeError(
                f"тренер: пакет версии {behavior}, а тренер на версии {version}: в синхронном "
                f"цикле задержка должна быть 0"
            )
        with stages.stage("logprob_recompute", step) as lp:
            old = recompute_logprobs(trainer, records, autocast_dtype=amp)
        with stages.stage("grpo_update", step) as upd:
            stats = grpo_step(trainer, optimizer, records, old, autocast_dtype=amp, scaler=scaler)
        trained_from, version = version, version + 1
        checksum_s, checksum = 0.0, None
        if verify:
            with stages.stage("checksum", step) as chk:
                checksum = state_checksum(trainer, dtype=wire_dtype)
            checksum_s = chk.duration_s
        meta = {"version": version, "trained_from_version": trained_from, "checksum": checksum}
        with stages.stage("send_weights", step) as snd:
            weight_bytes = send_tensors(trainer, GENERATOR_RANK, device, meta, wire_dtype)
        rows.append(
            {
                "step": step,
                "behavior_version": behavior,
                "trainer_version_before_update": trained_from,
                "lag": trained_from - behavior,
                "new_version": version,
                "wait_s": rs.wait_s,
                "recv_s": rs.transfer_s,
                "validate_s": val.duration_s,
                "logprob_s": lp.duration_s,
                "update_s": upd.duration_s,
                "train_s": lp.duration_s + upd.duration_s,
                "checksum_s": checksum_s,
                "weight_send_s": snd.duration_s,
                "step_s": time.perf_counter() - step_t0,
                "rollout_bytes": rs.nbytes,
                "weight_bytes": weight_bytes,
                "n_records": len(records),
                "reward_mean": _reward_mean(records),
                "loss": stats["loss"],
                "clip_fraction": stats["clip_fraction"],
                "grad_norm": stats["grad_norm"],
                "policy_tokens": stats["policy_tokens"],
            }
        )
    return {
        "role": ROLE_TRAINER,
        "trainer_dtype": "float32",
        "steps": rows,
        "final_version": version,
        "total_wait_s": sum(r["wait_s"] for r in rows),
        "weights_checksum": state_checksum(trainer, dtype=wire_dtype),
    }


# ----------------------------------------------------------------------------- урок 12.3

QUEUE_EXPERIMENT = "queue_generators_trainer"
QUEUE_TRAINER_RANK = 0
QUEUE_GENERATOR_RANKS = (1, 2)
WORKER_QUEUE_RU = "очередь (ранг 0)"
# Пауза генератора после отказа, прежде чем снова спросить разрешение, с.
QUEUE_RETRY_S = 0.02


def _generator_worker(rank: int) -> str:
    return f"{ROLE_GENERATOR} {rank}"


def rollout_tokens(records) -> int:
    """Стоимость группы роллаутов в очереди: Σ (токены запроса + токены ответа) по записям.

    Так очередь считает «вес» работы в токенах, а не в записях: длинный многоходовой эпизод
    весит больше короткого ответа (шаг 12.3.4). records — RolloutRecord или словари записей.
    """
    total = 0
    for r in records:
        get = r.get if isinstance(r, Mapping) else lambda k, r=r: getattr(r, k)
        total += len(get("prompt_tokens")) + len(get("response_tokens"))
    return int(total)


def _recv_object_any(device, group) -> tuple[int, Any, RecvStats]:
    """Принимает объект ``send_object`` от любого ранга (recv с src=None; умеет gloo, не NCCL).

    Возвращает (глобальный ранг отправителя, объект, RecvStats).
    """
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    size = torch.zeros(1, dtype=torch.int64, device=device)
    src = int(dist.recv(size, src=None, group=group))
    n = int(size.item())
    t1 = time.perf_counter()
    payload = torch.empty(n, dtype=torch.uint8, device=device)
    dist.recv(payload, src=src, group=group)
    obj = json.loads(payload.cpu().numpy().tobytes().decode("utf-8"))
    return src, obj, RecvStats(nbytes=n, wait_s=t1 - t0, transfer_s=time.perf_counter() - t1)


def queue_generators_trainer(
    rank: int,
    world_size: int,
    backend: str,
    duration_s: float = 6.0,
    max_queue_tokens: int = 1024,
    batch_tokens: int = 512,
    prompts_per_request: int = 1,
    group_size: int = 4,
    max_new_tokens: int = 16,
    train_delay_s: float = 0.0,
    seed: int = 0,
    model: str = "tiny",
    temperature: float = 1.0,
    lr: float = 1e-5,
    retry_s: float = QUEUE_RETRY_S,
) -> dict:
    """Асинхронный RL-цикл с очередью в токенах: ранг 0 — тренер и очередь, ранги 1, 2 — генераторы.

    Генератор перед каждым запросом спрашивает у тренера разрешение. Тренер разрешает,
    только пока в очереди меньше ``max_queue_tokens`` токенов: порог ограничивает **начало**
    работы, а уже начатые запросы («в полёте») доходят до очереди, поэтому глубина может
    превысить порог — не больше чем на токены работы, бывшей в полёте, когда очередь пересекла
    порог (overshoot < Σ по генераторам токенов одного запроса). После отказа генератор ждёт
    ``retry_s`` секунд и спрашивает снова (обратное давление). С разрешением генератор
    собирает ``prompts_per_request · group_size`` роллаутов настоящим ``generate_rollouts``
    той версией весов, что у него есть, и отправляет группу (записи, токены, версию) тренеру.
    В ответе на каждый запрос тренер сообщает номер последней версии весов; если у генератора
    старее, тренер тут же присылает новые веса (``send_tensors``), и генератор их загружает.

    Тренер: отдельный поток обучения ждёт, пока в очереди наберётся ≥ ``batch_tokens``
    токенов, забирает группы в порядке прихода (FIFO), пока пакет не наберёт ``batch_tokens``,
    делает ``grpo_step`` на fp32-копии и (по желанию) спит ``train_delay_s`` секунд — имитация
    медленного тренера, чтобы сделать μ < λ; после шага версия u → u+1 и готовится снимок
    весов для генераторов. Главный поток всё это время обслуживает сообщения генераторов.
    Задержка политики группы L = u − v ≥ 0 (u — версия тренера перед шагом, v — версия
    генерации). Через ``duration_s`` секунд тренер отвечает генераторам «стоп», принимает
    уже начатые запросы (слив) и новых шагов не начинает; остаток очереди — в отчёте.

    Токены группы — ``rollout_tokens`` (запрос + ответ всех записей). Скорости, токен/с:
    λ — наблюдаемый приток в очередь, λ_предл — предложенная нагрузка Σ_g токены_g / время
    генерации_g (сколько генераторы дали бы без отказов), μ — токены пакетов / время, когда
    тренер занят (шаг + train_delay_s); ρ = λ_предл / μ. Время — секунды от общей точки
    отсчёта (см. ``CLOCK_NOTE``). Обмен: JSON-сообщения с полем type (request/rollouts от
    генератора, grant/deny/stop от тренера); тренер принимает от того генератора, который
    прислал раньше (``dist.recv(src=None)``, на NCCL — через отдельную группу gloo).
    """
    if world_size != 3:
        raise ValueError(
            f"queue_generators_trainer: нужно ровно 3 процесса (ранг {QUEUE_TRAINER_RANK} — "
            f"тренер с очередью, ранги {QUEUE_GENERATOR_RANKS[0]} и {QUEUE_GENERATOR_RANKS[1]} — "
            f"генераторы), а world_size={world_size}; запустите nprocs=3"
        )
    if not is_int(rank) or not 0 <= rank < 3:
        raise ValueError(f"rank должно быть 0 (тренер) или 1, 2 (генераторы), получено {rank!r}")
    duration_s, retry_s = positive("duration_s", duration_s), positive("retry_s", retry_s)
    max_queue_tokens = integer("max_queue_tokens", max_queue_tokens, 1)
    batch_tokens = integer("batch_tokens", batch_tokens, 1, max_queue_tokens)  # иначе ждать вечно
    prompts_per_request = integer("prompts_per_request", prompts_per_request, 1)
    group_size = integer("group_size", group_size, 1)
    max_new_tokens = integer("max_new_tokens", max_new_tokens, 1)
    train_delay_s, seed = nonnegative("train_delay_s", train_delay_s), integer("seed", seed, 0)
    model = text("model", model)
    temperature, lr = positive("temperature", temperature), positive("lr", lr)
    import torch
    import torch.distributed as dist

    from course_utils.multiproc import local_device
    from course_utils.policy import load_policy

    device = local_device(backend)
    # Управляющие сообщения — на CPU: на gloo через основную группу, на NCCL — через
    # отдельную группу gloo (NCCL не умеет «принять от любого»). Веса идут основной группой.
    control = None if backend == "gloo" else dist.new_group(backend="gloo")
    t_ref = shared_time_ref(device)
    stages = _Stages(t_ref, device)
    torch.manual_seed(seed)
    with stages.stage("load_model"):
        net, tokenizer, info = load_policy(model, device=device)
    is_trainer = rank == QUEUE_TRAINER_RANK
    common = {
        "experiment": QUEUE_EXPERIMENT,
        "rank": rank,
        "world_size": world_size,
        "backend": backend,
        "role": ROLE_TRAINER if is_trainer else ROLE_GENERATOR,
        "worker": ROLE_TRAINER if is_trainer else _generator_worker(rank),
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "device": str(device),
        "model": info.describe(),
        "model_id": info.model_id,
        "num_params": info.num_params,
        "engine_dtype": info.dtype,
        "t_ref_unix": t_ref,
        "clock_note": CLOCK_NOTE,
        "config": {
            "duration_s": float(duration_s),
            "max_queue_tokens": max_queue_tokens,
            "batch_tokens": batch_tokens,
            "prompts_per_request": prompts_per_request,
            "group_size": group_size,
            "max_new_tokens": max_new_tokens,
            "train_delay_s": float(train_delay_s),
            "seed": seed,
            "temperature": float(temperature),
            "lr": float(lr),
            "retry_s": float(retry_s),
            "n_generators": len(QUEUE_GENERATOR_RANKS),
        },
    }
    cfg = dict(common["config"])
    if is_trainer:
        out = _QueueTrainer(net, info, device, control, stages, cfg).run()
    else:
        out = _run_queue_generator(rank, net, tokenizer, info, device, control, stages, cfg)
    return {**common, **out, "events": stages.events}


def _run_queue_generator(rank, net, tokenizer, info, device, control, stages, cfg) -> dict:
    import torch

    from course_utils.policy import generate_rollouts, make_tasks

    cdev = _device("cpu")
    trainer = QUEUE_TRAINER_RANK
    engine = net.eval()

    def now() -> float:
        return time.time() - stages.t_ref

    with stages.stage("handshake"):
        hello = {"model_id": info.model_id, "num_params": info.num_params, "dtype": info.dtype}
        send_object({"type": "hello", **hello}, trainer, cdev, control)
    version, k, staging = 0, 0, None
    requests, fetches = [], []
    denials_total, backoff_s, denials_k, first_ask = 0, 0.0, 0, None
    while True:
        if first_ask is None:
            first_ask = now()
        with stages.stage("permission", k):
            send_object(
                {"type": "request", "request_id": k, "version": version}, trainer, cdev, control
            )
            reply, _ = recv_object(trainer, cdev, control)
        if reply.get("weights_follow"):
            wall0 = time.time()
            meta, staging, rs = recv_tensors(trainer, device, staging)
            stages.add("recv_weights", k, wall0, rs.wait_s + rs.transfer_s)
            with stages.stage("load_weights", k) as load, torch.no_grad():
                params = dict(engine.named_parameters())
                for name, buf in staging.items():
                    params[name].copy_(buf)
            if int(meta["version"]) <= version:
                raise RuntimeError(
                    f"генератор {rank}: пришли веса версии {meta['version']}, а у него уже "
                    f"{version} — версии должны только расти"
                )
            fetches.append(
                {
                    "time_s": wall0 - stages.t_ref,
                    "request_id": k,
                    "from_version": version,
                    "version": int(meta["version"]),
                    "bytes": rs.nbytes,
                    "recv_s": rs.wait_s + rs.transfer_s,
                    "load_s": load.duration_s,
                }
            )
            version = int(meta["version"])
        kind = reply.get("type")
        if kind == "stop":
            break
        if kind == "deny":
            denials_total += 1
            denials_k += 1
            with stages.stage("backpressure_wait", k) as wait:
                time.sleep(cfg["retry_s"])
            backoff_s += wait.duration_s
            continue
        if kind != "grant":
            raise RuntimeError(f"генератор {rank}: неизвестный ответ тренера {reply!r}")
        granted = now()
        req_seed = cfg["seed"] * 1_000_000 + rank * 100_000 + k
        tasks = make_tasks(cfg["prompts_per_request"], seed=req_seed)
        with stages.stage("generate", k) as gen:
            batch = generate_rollouts(
                engine,
                tokenizer,
                tasks,
                group_size=cfg["group_size"],
                temperature=cfg["temperature"],
                max_new_tokens=cfg["max_new_tokens"],
                policy_version=version,
                seed=req_seed,
                run_id=f"q{cfg['seed']}r{rank}",
            )
        gen_end = now()
        tokens = rollout_tokens(batch.records)
        payload = {
            "type": "rollouts",
            "request_id": k,
            "version": version,
            "tokens": tokens,
            "generate_s": gen.duration_s,
            "records": [r.to_dict() for r in batch.records],
        }
        with stages.stage("send_rollouts", k) as snd:
            nbytes = send_object(payload, trainer, cdev, control)
        requests.append(
            {
                "request_id": k,
                "first_ask_s": first_ask,
                "granted_s": granted,
                "denials": denials_k,
                "gen_start_s": gen_end - gen.duration_s,
                "gen_end_s": gen_end,
                "sent_s": gen_end + snd.duration_s,
                "version": version,
                "tokens": tokens,
                "output_tokens": batch.output_tokens,
                "n_records": len(batch.records),
                "generate_s": gen.duration_s,
                "send_s": snd.duration_s,
                "rollout_bytes": nbytes,
                "reward_mean": _reward_mean(batch.records),
            }
        )
        k, denials_k, first_ask = k + 1, 0, None
    gen_s = sum(r["generate_s"] for r in requests)
    tokens = sum(r["tokens"] for r in requests)
    return {
        "requests": requests,
        "weight_fetches": fetches,
        "n_requests": len(requests),
        "denials": denials_total,
        "backpressure_wait_s": backoff_s,
        "tokens_generated": tokens,
        "generate_s": gen_s,
        "capacity_tokens_per_s": tokens / gen_s if gen_s > 0 else 0.0,
        "final_version": version,
    }


class _QueueTrainer:
    """Тренер урока 12.3 в ранге 0: очередь (главный поток) и обучение (второй поток).

    Главный поток принимает сообщения генераторов и меняет очередь под замком; поток обучения
    ждёт пакет на условной переменной. Операции torch.distributed делает только главный поток.
    Каждое событие очереди (разрешение, отказ, приход, снятие пакета) получает номер seq —
    порядок событий под замком, по нему проверяется граница превышения порога.
    """

    def __init__(self, net, info, device, control, stages, cfg) -> None:
        import torch

        from course_utils.policy import grad_scaler_for, trainer_autocast_dtype

        self.info, self.device, self.control, self.stages, self.cfg = (
            info,
            device,
            control,
            stages,
            cfg,
        )
        self.wire_dtype = next(net.parameters()).dtype  # веса уходят движкам в их типе
        self.trainer = net.float()
        self.amp = trainer_autocast_dtype(device, self.wire_dtype)
        self.scaler = grad_scaler_for(device, self.amp)  # float16 на T4: GradScaler
        self.optimizer = torch.optim.AdamW(self.trainer.parameters(), lr=cfg["lr"])
        self.cond = threading.Condition()
        self.seq = 0
        self.queue: deque = deque()
        self.q_tokens = 0
        self.q_rollouts = 0
        self.version = 0
        self.snapshot = self._snapshot()
        self.stopping = False
        self.error: BaseException | None = None
        self.timeline: list[dict] = []
        self.permissions: list[dict] = []
        self.arrivals: list[dict] = []
        self.batches: list[dict] = []
        self.weight_sends: list[dict] = []
        self.in_flight: dict[tuple[int, int], dict] = {}

    def now(self) -> float:
        return time.time() - self.stages.t_ref

    def _snapshot(self) -> dict:
        import torch

        with torch.no_grad():
            return {
                n: p.detach().to(self.wire_dtype).clone()
                for n, p in self.trainer.named_parameters()
            }

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _mark(self, event: str) -> None:
        """Строка временной шкалы очереди (вызывается под замком)."""
        self.timeline.append(
            {
                "seq": self._next_seq(),
                "time_s": self.now(),
                "event": event,
                "depth_tokens": self.q_tokens,
                "depth_rollouts": self.q_rollouts,
                "depth_groups": len(self.queue),
            }
        )

    # ------------------------------------------------------------------ поток обучения

    def _train_loop(self) -> None:
        from course_utils.contract import RolloutRecord
        from course_utils.policy import grpo_step

        try:
            b = 0
            while True:
                wall0 = time.time()
                with self.cond:
                    while not self.stopping and self.q_tokens < self.cfg["batch_tokens"]:
                        self.cond.wait(timeout=0.1)
                    waited = time.time() - wall0
                    if self.stopping:
                        self.stages.add("wait_rollouts", b, wall0, waited)
                        return
                    groups, tokens = [], 0
                    while self.queue and tokens < self.cfg["batch_tokens"]:
                        g = self.queue.popleft()
                        groups.append(g)
                        tokens += g["tokens"]
                        self.q_tokens -= g["tokens"]
                        self.q_rollouts -= len(g["records"])
                    self._mark("batch")
                    pop_seq, pop_s = self.timeline[-1]["seq"], self.timeline[-1]["time_s"]
                    u = self.version
                self.stages.add("wait_rollouts", b, wall0, waited)
                records = [RolloutRecord.from_dict(d) for g in groups for d in g["records"]]
                with self.stages.stage("grpo_update", b) as upd:
                    stats = grpo_step(
                        self.trainer,
                        self.optimizer,
                        records,
                        autocast_dtype=self.amp,
                        scaler=self.scaler,
                    )
                delay = 0.0
                if self.cfg["train_delay_s"] > 0:
                    with self.stages.stage("train_delay", b) as slow:
                        time.sleep(self.cfg["train_delay_s"])
                    delay = slow.duration_s
                with self.stages.stage("snapshot_weights", b):
                    snap = self._snapshot()
                lags = [u - g["version"] for g in groups]
                with self.cond:
                    self.version, self.snapshot = u + 1, snap
                    end_s = self.now()
                    self.batches.append(
                        {
                            "batch": b,
                            "pop_seq": pop_seq,
                            "pop_s": pop_s,
                            "end_s": end_s,
                            "train_s": upd.duration_s,
                            "delay_s": delay,
                            "busy_s": upd.duration_s + delay,
                            "tokens": tokens,
                            "n_groups": len(groups),
                            "n_records": len(records),
                            "generators": [g["generator"] for g in groups],
                            "behavior_versions": [g["version"] for g in groups],
                            "trainer_version": u,
                            "lags": lags,
                            "mean_lag": sum(lags) / len(lags),
                            "max_lag": max(lags),
                            "new_version": u + 1,
                            "queue_wait_s": [pop_s - g["arrival_s"] for g in groups],
                            "loss": stats["loss"],
                            "clip_fraction": stats["clip_fraction"],
                            "grad_norm": stats["grad_norm"],
                            "policy_tokens": stats["policy_tokens"],
                            "reward_mean": stats["mean_reward"],
                        }
                    )
                b += 1
        except BaseException as exc:  # главный поток перебросит ошибку
            with self.cond:
                self.error = exc
                self.stopping = True
                self.cond.notify_all()

    # ------------------------------------------------------------------ главный поток

    def _handshake(self) -> None:
        mine = {"model_id": self.info.model_id, "num_params": self.info.num_params}
        mine["dtype"] = self.info.dtype
        for g in QUEUE_GENERATOR_RANKS:
            hello, _ = recv_object(g, "cpu", self.control)
            theirs = {k: hello.get(k) for k in mine}
            if hello.get("type") != "hello" or theirs != mine:
                raise RuntimeError(
                    f"тренер: у генератора {g} другая модель: {theirs}, у тренера {mine}"
                )

    def _on_request(self, src: int, msg: Mapping) -> None:
        key = (src, int(msg["request_id"]))
        with self.cond:
            depth = self.q_tokens
            if self.stopping:
                decision = "stop"
            elif depth < self.cfg["max_queue_tokens"]:
                decision = "grant"
            else:
                decision = "deny"
            latest, snap = self.version, self.snapshot
            follow = decision != "stop" and int(msg["version"]) < latest
            seq = self._next_seq()
            if decision == "grant":
                if key in self.in_flight:
                    raise RuntimeError(f"тренер: запрос {key} уже разрешён и ещё в полёте")
                self.in_flight[key] = {"grant_seq": seq, "granted_s": self.now()}
            self.permissions.append(
                {
                    "seq": seq,
                    "time_s": self.now(),
                    "generator": src,
                    "request_id": key[1],
                    "decision": decision,
                    "granted": decision == "grant",
                    "depth_tokens": depth,
                    "generator_version": int(msg["version"]),
                    "latest_version": latest,
                    "weights_sent": follow,
                }
            )
        reply = {"type": decision, "latest_version": latest, "weights_follow": follow}
        send_object(reply, src, "cpu", self.control)
        if follow:
            with self.stages.stage("send_weights", key[1], WORKER_QUEUE_RU) as snd:
                nbytes = send_tensors(snap, src, self.device, {"version": latest}, self.wire_dtype)
            self.weight_sends.append(
                {
                    "time_s": self.now() - snd.duration_s,
                    "generator": src,
                    "version": latest,
                    "bytes": nbytes,
                    "send_s": snd.duration_s,
                }
            )

    def _on_rollouts(self, src: int, msg: Mapping) -> None:
        from course_utils.contract import validate_rollout

        key = (src, int(msg["request_id"]))
        problems = []
        for i, d in enumerate(msg["records"]):
            problems += [f"запись {i}: {p}" for p in validate_rollout(d)]
        if problems:
            raise ValueError(
                f"тренер: группа генератора {src} нарушает контракт:\n" + "\n".join(problems[:10])
            )
        tokens = rollout_tokens(msg["records"])
        if tokens != msg.get("tokens"):
            raise RuntimeError(
                f"тренер: генератор {src} заявил {msg.get('tokens')} токенов, в записях {tokens}"
            )
        versions = {d.get("policy_version") for d in msg["records"]}
        if versions != {msg["version"]}:
            raise RuntimeError(
                f"тренер: версии записей {sorted(versions, key=str)} не совпадают с версией "
                f"группы {msg['version']}"
            )
        with self.cond:
            grant = self.in_flight.pop(key, None)
            if grant is None:
                raise RuntimeError(f"тренер: пришла группа {key}, на которую не было разрешения")
            arrival_s = self.now()
            self.q_tokens += tokens
            self.q_rollouts += len(msg["records"])
            self.queue.append(
                {
                    "generator": src,
                    "request_id": key[1],
                    "version": int(msg["version"]),
                    "tokens": tokens,
                    "records": msg["records"],
                    "arrival_s": arrival_s,
                }
            )
            self._mark("arrival")
            self.arrivals.append(
                {
                    "seq": self.timeline[-1]["seq"],
                    "time_s": arrival_s,
                    "generator": src,
                    "request_id": key[1],
                    "tokens": tokens,
                    "n_records": len(msg["records"]),
                    "behavior_version": int(msg["version"]),
                    "grant_seq": grant["grant_seq"],
                    "granted_s": grant["granted_s"],
                    "in_flight_s": arrival_s - grant["granted_s"],
                    "generate_s": float(msg["generate_s"]),
                    "depth_tokens": self.q_tokens,
                }
            )
            self.cond.notify_all()

    def run(self) -> dict:
        with self.stages.stage("handshake"):
            self._handshake()
        with self.cond:
            self._mark("start")
        start_s = self.timeline[0]["time_s"]
        stop_at = start_s + self.cfg["duration_s"]
        worker = threading.Thread(target=self._train_loop, name="trainer", daemon=True)
        worker.start()
        stopped: set[int] = set()
        stop_s = None
        while len(stopped) < len(QUEUE_GENERATOR_RANKS):
            src, msg, _ = _recv_object_any(_device("cpu"), self.control)
            if self.error is not None:
                raise RuntimeError("тренер: ошибка в потоке обучения") from self.error
            if stop_s is None and self.now() >= stop_at:
                with self.cond:
                    self.stopping = True
                    self.cond.notify_all()
                stop_s = self.now()
            kind = msg.get("type") if isinstance(msg, Mapping) else None
            if src not in QUEUE_GENERATOR_RANKS or src in stopped:
                raise RuntimeError(f"тренер: неожиданное сообщение от ранга {src}: {kind!r}")
            if kind == "request":
                self._on_request(src, msg)
                if self.permissions[-1]["decision"] == "stop":
                    stopped.add(src)
            elif kind == "rollouts":
                self._on_rollouts(src, msg)
            else:
                raise RuntimeError(f"тренер: неизвестный тип сообщения {kind!r} от ранга {src}")
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        worker.join()
        if self.error is not None:
            raise RuntimeError("тренер: ошибка в потоке обучения") from self.error
        if self.in_flight:
            raise RuntimeError(f"тренер: после слива в полёте остались {sorted(self.in_flight)}")
        with self.cond:
            self._mark("end")
        return self._report(start_s, stop_s if stop_s is not None else self.now())

    # ------------------------------------------------------------------ отчёт

    def _report(self, start_s: float, stop_s: float) -> dict:
        threshold = self.cfg["max_queue_tokens"]
        timeline = _with_in_flight(self.timeline, self.permissions, self.arrivals, threshold)
        peak = max(timeline, key=lambda r: (r["depth_tokens"], -r["seq"]))
        end_s = timeline[-1]["time_s"]
        arrived = sum(a["tokens"] for a in self.arrivals)
        consumed = sum(b["tokens"] for b in self.batches)
        busy = sum(b["busy_s"] for b in self.batches)
        offered = 0.0
        for g in QUEUE_GENERATOR_RANKS:
            mine = [a for a in self.arrivals if a["generator"] == g]
            gen_s = sum(a["generate_s"] for a in mine)
            if gen_s > 0:
                offered += sum(a["tokens"] for a in mine) / gen_s
        lam = arrived / (end_s - start_s) if end_s > start_s else 0.0  # то же окно, что у занятости
        mu = consumed / busy if busy > 0 else 0.0
        lags = [lag for b in self.batches for lag in b["lags"]]
        grants = sum(p["decision"] == "grant" for p in self.permissions)
        denials = sum(p["decision"] == "deny" for p in self.permissions)
        return {
            "timeline": timeline,
            "arrivals": self.arrivals,
            "permissions": self.permissions,
            "batches": self.batches,
            "weight_sends": self.weight_sends,
            "threshold_tokens": threshold,
            "batch_tokens": self.cfg["batch_tokens"],
            "start_s": start_s,
            "stop_s": stop_s,
            "end_s": end_s,
            "tokens_arrived": arrived,
            "tokens_consumed": consumed,
            "left_in_queue_tokens": self.q_tokens,
            "left_in_queue_groups": len(self.queue),
            "busy_s": busy,
            "busy_fraction": busy / (end_s - start_s) if end_s > start_s else 0.0,
            "lambda_tokens_per_s": lam,
            "offered_lambda_tokens_per_s": offered,
            "mu_tokens_per_s": mu,
            "rho": offered / mu if mu > 0 else None,
            "peak_depth_tokens": peak["depth_tokens"],
            "peak_time_s": peak["time_s"],
            "overshoot_tokens": max(0, peak["depth_tokens"] - threshold),
            "peak_in_flight_tokens": peak["crossing_in_flight_tokens"]
            if peak["crossing_in_flight_tokens"] is not None
            else peak["in_flight_tokens"],
            "bound_holds": all(
                r["bound_tokens"] is None or r["depth_tokens"] <= r["bound_tokens"]
                for r in timeline
            ),
            "grants": grants,
            "denials": denials,
            "n_batches": len(self.batches),
            "final_version": self.version,
            "mean_lag": sum(lags) / len(lags) if lags else None,
            "max_lag": max(lags) if lags else None,
            "trainer_dtype": "float32",
            "weights_checksum": state_checksum(self.trainer, dtype=self.wire_dtype),
        }


def _with_in_flight(timeline, permissions, arrivals, threshold) -> list[dict]:
    """Дополняет строки шкалы очереди работой «в полёте» и границей превышения порога.

    in_flight_tokens строки с номером s — токены запросов, разрешённых до s (grant_seq < s) и
    пришедших не раньше s (включая группу, пришедшую этим событием). Когда очередь пересекает
    порог T событием k (глубина до него D_{k−1} < T), новых разрешений нет, пока глубина ≥ T,
    поэтому до возвращения ниже порога глубина ≤ bound = D_{k−1} + in_flight_tokens(k) < T +
    in_flight_tokens(k). crossing_in_flight_tokens — это in_flight_tokens(k); ниже порога оба
    поля None.
    """
    arrived_at = {(a["generator"], a["request_id"]): (a["seq"], a["tokens"]) for a in arrivals}
    grants = [
        (p["seq"], *arrived_at.get((p["generator"], p["request_id"]), (math.inf, 0)))
        for p in permissions
        if p["decision"] == "grant"
    ]
    rows, prev_depth, crossing, bound = [], 0, None, None
    for row in timeline:
        s = row["seq"]
        flying = [(a_seq, tok) for g_seq, a_seq, tok in grants if g_seq < s <= a_seq]
        in_flight = sum(tok for _, tok in flying)
        depth = row["depth_tokens"]
        if depth >= threshold:
            if prev_depth < threshold:
                crossing, bound = in_flight, prev_depth + in_flight
        else:
            crossing, bound = None, None
        rows.append(
            {
                **row,
                "in_flight_tokens": in_flight,
                "in_flight_requests": len(flying),
                "crossing_in_flight_tokens": crossing,
                "bound_tokens": bound,
            }
        )
        prev_depth = depth
    return rows


# ----------------------------------------------------------------------------- таблицы для ноутбука


def _results_by_role(launch_result: Any, name: str) -> dict[str, dict]:
    """Результаты рангов по ролям из LaunchResult (или списка словарей рангов)."""
    results = getattr(launch_result, "results", launch_result)
    if getattr(launch_result, "ok", True) is False:
        summary = getattr(launch_result, "summary", lambda: "")()
        raise ValueError(f"{name}: запуск завершился неуспешно, таблицы нет.\n{summary}")
    if isinstance(results, str | bytes) or not isinstance(results, Sequence):
        raise ValueError(
            f"{name} должно быть LaunchResult или списком словарей рангов, "
            f"получено {type(launch_result).__name__}"
        )
    if any(isinstance(r, Mapping) and r.get("experiment") == QUEUE_EXPERIMENT for r in results):
        raise ValueError(
            f"{name}: это результат queue_generators_trainer — для него queue_timeline_frame, "
            f"queue_batches_frame, queue_summary и events_frame"
        )
    by_role = {}
    for res in results:
        if isinstance(res, Mapping) and res.get("role") in (ROLE_GENERATOR, ROLE_TRAINER):
            by_role[res["role"]] = res
    missing = [r for r in (ROLE_GENERATOR, ROLE_TRAINER) if r not in by_role]
    if missing:
        raise ValueError(
            f"{name}: нет результатов ролей {missing} — это результат sync_generator_trainer?"
        )
    return by_role


def sync_steps_frame(launch_result: Any):
    """Одна таблица шагов обоих процессов (pandas.DataFrame), время — секунды, объём — байты.

    Столбцы: step, behavior_version, trainer_version_before_update, lag (= u − v),
    new_version, generator_generate_s, generator_send_s, generator_wait_s,
    generator_weight_recv_s, generator_load_s, trainer_wait_s, trainer_recv_s, trainer_train_s,
    trainer_weight_send_s, rollout_bytes, weight_bytes, n_records, reward_mean, loss,
    clip_fraction, grad_norm. launch_result — итог ``multiproc.launch`` для
    ``sync_generator_trainer`` (или список словарей рангов).
    """
    import pandas as pd

    by_role = _results_by_role(launch_result, "launch_result")
    gen = pd.DataFrame(by_role[ROLE_GENERATOR]["steps"])
    tr = pd.DataFrame(by_role[ROLE_TRAINER]["steps"])
    g_cols = {
        "generate_s": "generator_generate_s",
        "send_s": "generator_send_s",
        "wait_s": "generator_wait_s",
        "weight_recv_s": "generator_weight_recv_s",
        "load_s": "generator_load_s",
    }
    t_cols = {
        "wait_s": "trainer_wait_s",
        "recv_s": "trainer_recv_s",
        "train_s": "trainer_train_s",
        "weight_send_s": "trainer_weight_send_s",
    }
    front = ["step", "behavior_version", "trainer_version_before_update", "lag", "new_version"]
    tail = ["rollout_bytes", "weight_bytes", "n_records", "reward_mean"]
    tail += ["loss", "clip_fraction", "grad_norm"]
    merged = tr[front].merge(
        gen[["step", *g_cols]].rename(columns=g_cols), on="step", validate="1:1"
    )
    merged = merged.merge(
        tr[["step", *t_cols, *tail]].rename(columns=t_cols), on="step", validate="1:1"
    )
    order = [*front, *g_cols.values(), *t_cols.values(), *tail]
    return merged[order].sort_values("step").reset_index(drop=True)


# Русские заголовки столбцов sync_steps_frame для показа: frame.rename(columns=...).
SYNC_STEP_COLUMNS_RU = {
    "step": "шаг",
    "behavior_version": "версия генерации v",
    "trainer_version_before_update": "версия тренера до шага u",
    "lag": "задержка политики u − v, версий",
    "new_version": "новая версия",
    "generator_generate_s": "генератор: генерация, с",
    "generator_send_s": "генератор: отправка роллаутов, с",
    "generator_wait_s": "генератор: ожидание весов, с",
    "generator_weight_recv_s": "генератор: приём весов, с",
    "generator_load_s": "генератор: загрузка весов, с",
    "trainer_wait_s": "тренер: ожидание роллаутов, с",
    "trainer_recv_s": "тренер: приём роллаутов, с",
    "trainer_train_s": "тренер: обучение, с",
    "trainer_weight_send_s": "тренер: отправка весов, с",
    "rollout_bytes": "роллауты, байт",
    "weight_bytes": "веса, байт",
    "n_records": "роллаутов",
    "reward_mean": "средняя награда",
    "loss": "потери",
    "clip_fraction": "доля клиппирования",
    "grad_norm": "норма градиента",
}


# Вид работы каждой стадии — для читаемой диаграммы Ганта (5 цветов вместо 15).
STAGE_KINDS_RU = {
    "load_model": "загрузка модели",
    "handshake": "рукопожатие",
    "generate": "генерация",
    "wait_rollouts": "ожидание",
    "wait_weights": "ожидание",
    "send_rollouts": "передача",
    "recv_rollouts": "передача",
    "send_weights": "передача",
    "recv_weights": "передача",
    "validate": "обучение",
    "logprob_recompute": "обучение",
    "grpo_update": "обучение",
    "checksum": "проверка и загрузка весов",
    "verify_weights": "проверка и загрузка весов",
    "load_weights": "проверка и загрузка весов",
    # урок 12.3, queue_generators_trainer
    "permission": "ожидание",
    "backpressure_wait": "обратное давление",
    "train_delay": "обучение",
    "snapshot_weights": "проверка и загрузка весов",
}


def events_frame(launch_result: Any, by_kind: bool = False):
    """События всех процессов для ``tracing.gantt``: worker, stage, start_s, end_s, duration_s
    (секунды от общей точки отсчёта, см. ``CLOCK_NOTE``), step, rank.

    Для ``sync_generator_trainer`` worker — "генератор"/"тренер". Для
    ``queue_generators_trainer`` — "тренер" (поток обучения), "очередь (ранг 0)" (отправка
    весов главным потоком тренера), "генератор 1", "генератор 2"; step — номер пакета у
    тренера и номер запроса у генератора. ``by_kind=True`` заменяет имя стадии её видом из
    ``STAGE_KINDS_RU`` (генерация, обучение, передача, ожидание, обратное давление, …);
    исходное имя остаётся в столбце ``detail``.
    """
    import pandas as pd

    results = getattr(launch_result, "results", launch_result)
    if (
        isinstance(results, Sequence)
        and not isinstance(results, str | bytes)
        and any(isinstance(r, Mapping) and r.get("experiment") == QUEUE_EXPERIMENT for r in results)
    ):
        trainer, generators = _queue_results(launch_result, "launch_result")
        sources = [(trainer.get("worker", ROLE_TRAINER), trainer)]
        sources += [(g.get("worker", _generator_worker(g["rank"])), g) for g in generators]
    else:
        by_role = _results_by_role(launch_result, "launch_result")
        sources = [(role, by_role[role]) for role in (ROLE_GENERATOR, ROLE_TRAINER)]
    rows = []
    for role, res in sources:
        for ev in res.get("events", []):
            rows.append(
                {
                    "trace_id": None,
                    "worker": ev.get("worker", role),
                    "stage": ev["stage"],
                    "start_s": float(ev["start_s"]),
                    "end_s": float(ev["end_s"]),
                    "duration_s": float(ev["end_s"]) - float(ev["start_s"]),
                    "step": ev.get("step"),
                    "rank": res.get("rank"),
                }
            )
    columns = ["trace_id", "worker", "stage", "start_s", "end_s", "duration_s", "step", "rank"]
    frame = pd.DataFrame(rows, columns=columns)
    if by_kind:
        frame["detail"] = frame["stage"]
        frame["stage"] = frame["stage"].map(lambda s: STAGE_KINDS_RU.get(s, s))
    return frame.sort_values(["start_s", "rank"], kind="stable").reset_index(drop=True)


# ----------------------------------------------------------------------------- таблицы урока 12.3


def _queue_results(launch_result: Any, name: str) -> tuple[dict, list[dict]]:
    """(результат тренера, [результаты генераторов по рангам]) запуска queue_generators_trainer."""
    results = getattr(launch_result, "results", launch_result)
    if getattr(launch_result, "ok", True) is False:
        summary = getattr(launch_result, "summary", lambda: "")()
        raise ValueError(f"{name}: запуск завершился неуспешно, таблицы нет.\n{summary}")
    if isinstance(results, str | bytes) or not isinstance(results, Sequence):
        raise ValueError(
            f"{name} должно быть LaunchResult или списком словарей рангов, "
            f"получено {type(launch_result).__name__}"
        )
    mine = [
        r for r in results if isinstance(r, Mapping) and r.get("experiment") == QUEUE_EXPERIMENT
    ]
    trainers = [r for r in mine if r.get("role") == ROLE_TRAINER]
    generators = sorted(
        (r for r in mine if r.get("role") == ROLE_GENERATOR), key=lambda r: r.get("rank", 0)
    )
    if len(trainers) != 1 or not generators:
        raise ValueError(
            f"{name}: нужны результаты тренера и генераторов queue_generators_trainer "
            f"(найдено тренеров: {len(trainers)}, генераторов: {len(generators)})"
        )
    return dict(trainers[0]), [dict(g) for g in generators]


def queue_timeline_frame(launch_result: Any):
    """Глубина очереди во времени (pandas.DataFrame), строка на изменение очереди.

    Столбцы: seq (порядок событий у тренера), time_s (с от общей точки отсчёта), event
    ("start", "arrival" — пришла группа, "batch" — тренер забрал пакет, "end"), depth_tokens,
    depth_rollouts, depth_groups (глубина после события), in_flight_tokens / in_flight_requests
    (работа, разрешённая до события и ещё не дошедшая до очереди, включая приходящую этим
    событием), crossing_in_flight_tokens и bound_tokens (выше порога: работа в полёте в момент
    пересечения порога и граница глубины, см. ``queue_generators_trainer``), threshold_tokens.
    Глубина — ступенчатая функция: рисуйте ``drawstyle="steps-post"``.
    """
    import pandas as pd

    trainer, _ = _queue_results(launch_result, "launch_result")
    frame = pd.DataFrame(trainer["timeline"])
    frame["threshold_tokens"] = trainer["threshold_tokens"]
    for col in ("crossing_in_flight_tokens", "bound_tokens"):
        frame[col] = frame[col].astype("Float64")
    return frame


def queue_batches_frame(launch_result: Any):
    """Пакеты, съеденные тренером (pandas.DataFrame), строка на пакет.

    Столбцы: batch, pop_s (с — когда пакет снят с очереди), end_s (конец шага), train_s и
    delay_s (шаг GRPO и искусственная задержка, с), tokens, n_groups, n_records,
    trainer_version (u — версия перед шагом), new_version (u+1), behavior_versions и lags (по
    группам: v и L = u − v), mean_lag, max_lag, mean_queue_wait_s (среднее время группы в
    очереди, с), loss, clip_fraction, grad_norm, reward_mean.
    """
    import pandas as pd

    trainer, _ = _queue_results(launch_result, "launch_result")
    columns = [
        "batch",
        "pop_s",
        "end_s",
        "train_s",
        "delay_s",
        "tokens",
        "n_groups",
        "n_records",
        "trainer_version",
        "new_version",
        "behavior_versions",
        "lags",
        "mean_lag",
        "max_lag",
        "mean_queue_wait_s",
        "loss",
        "clip_fraction",
        "grad_norm",
        "reward_mean",
    ]
    rows = []
    for b in trainer["batches"]:
        waits = b["queue_wait_s"]
        rows.append({**b, "mean_queue_wait_s": sum(waits) / len(waits) if waits else 0.0})
    return pd.DataFrame(rows, columns=columns)


def queue_requests_frame(launch_result: Any):
    """Запросы генераторов (pandas.DataFrame), строка на разрешённый запрос.

    Столбцы: worker ("генератор 1"…), rank, request_id, first_ask_s (первая просьба о
    разрешении), granted_s, denials (отказов до разрешения), gen_start_s, gen_end_s, sent_s,
    version (версия весов генерации), tokens, output_tokens, n_records, generate_s, send_s,
    reward_mean; времена — секунды от общей точки отсчёта.
    """
    import pandas as pd

    _, generators = _queue_results(launch_result, "launch_result")
    rows = []
    for g in generators:
        for r in g["requests"]:
            rows.append({"worker": g.get("worker"), "rank": g.get("rank"), **r})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.sort_values(["granted_s", "rank"], kind="stable").reset_index(drop=True)


# Ключ сводки → (подпись, единица); порядок — порядок строк queue_summary_text.
QUEUE_SUMMARY_RU = {
    "offered_lambda_tokens_per_s": ("λ_предл, предложенная нагрузка генераторов", "токенов/с"),
    "mu_tokens_per_s": ("μ, скорость тренера, пока он занят", "токенов/с"),
    "rho": ("ρ = λ_предл / μ", "раз"),
    "lambda_tokens_per_s": ("λ, принятый приток в очередь (после допуска)", "токенов/с"),
    "consumed_tokens_per_s": ("из него съел тренер: μ × доля занятости", "токенов/с"),
    "accumulated_tokens_per_s": ("из него накопилось в очереди к концу", "токенов/с"),
    "window_s": ("окно W: от старта до конца последнего шага", "с"),
    "duration_s": ("длительность приёма запросов", "с"),
    "grants": ("разрешений", "шт."),
    "denials": ("отказов (обратное давление)", "шт."),
    "generator_blocked_s": ("генераторы простояли после отказов (сумма)", "с"),
    "generator_blocked_share": ("доля времени приёма, простоянная генераторами", "доля"),
    "threshold_tokens": ("порог очереди T", "токенов"),
    "batch_tokens": ("размер пакета", "токенов"),
    "peak_depth_tokens": ("пиковая глубина очереди", "токенов"),
    "overshoot_tokens": ("превышение порога max(0, пик − T)", "токенов"),
    "peak_in_flight_tokens": ("работа в полёте при пересечении порога", "токенов"),
    "overshoot_bound_holds": ("граница пик < T + работа в полёте выполнена", ""),
    "n_batches": ("шагов обучения", "шт."),
    "final_version": ("итоговая версия весов", ""),
    "mean_lag": ("средняя задержка политики L = u − v", "версий"),
    "max_lag": ("максимальная задержка политики", "версий"),
    "busy_fraction": ("доля окна W, когда тренер занят", "доля"),
    "left_in_queue_tokens": ("осталось в очереди после остановки", "токенов"),
}
_TWO_DECIMALS = {"rho", "busy_fraction", "mean_lag", "generator_blocked_share"}
_ONE_DECIMAL = {"duration_s", "window_s", "generator_blocked_s"}


def queue_summary(launch_result: Any) -> dict:
    """Сводка запуска ``queue_generators_trainer``: словарь с английскими ключами.

    Скорости (токенов/с) на одном окне W = конец последнего шага − старт (window_s, с):
    lambda_tokens_per_s — принятый приток λ = пришедшие токены / W; consumed_tokens_per_s —
    съеденные тренером / W = μ · busy_fraction; accumulated_tokens_per_s — оставшиеся в
    очереди / W; λ = съедено + накоплено (токены сохраняются). offered_lambda_tokens_per_s —
    λ_предл = Σ_g токены_g / время генерации_g (сколько генераторы дали бы без отказов);
    mu_tokens_per_s — μ = токены пакетов / время занятости тренера; rho = λ_предл / μ (> 1 —
    без обратного давления очередь росла бы без предела). generator_blocked_s — сумма по
    генераторам времени ожидания после отказов (с), generator_blocked_share — она же / (число
    генераторов × duration_s), duration_s — длительность приёма запросов (с). Остальное:
    порог T, пик и превышение (токенов), разрешения и отказы, шаги, версии, задержки (версий).
    Подписи и единицы — ``QUEUE_SUMMARY_RU``; текст — ``queue_summary_text``.
    """
    trainer, generators = _queue_results(launch_result, "launch_result")
    window = float(trainer["end_s"] - trainer["start_s"])
    accepting = float(trainer["stop_s"] - trainer["start_s"])
    blocked = float(sum(g.get("backpressure_wait_s", 0.0) for g in generators))
    out = {k: trainer[k] for k in QUEUE_SUMMARY_RU if k in trainer}
    out.update(
        {
            "consumed_tokens_per_s": trainer["tokens_consumed"] / window if window > 0 else 0.0,
            "accumulated_tokens_per_s": trainer["left_in_queue_tokens"] / window
            if window > 0
            else 0.0,
            "window_s": window,
            "duration_s": accepting,
            "generator_blocked_s": blocked,
            "generator_blocked_share": blocked / (len(generators) * accepting)
            if accepting > 0
            else 0.0,
            "overshoot_bound_holds": bool(trainer["bound_holds"]),
        }
    )
    return {k: out[k] for k in QUEUE_SUMMARY_RU}


def queue_summary_text(launch_result_or_summary: Any) -> str:
    """Сводка очереди по-русски: строка «подпись, единица: значение» на величину."""
    from course_utils.fmt import num

    if isinstance(launch_result_or_summary, Mapping) and "rho" in launch_result_or_summary:
        summary = dict(launch_result_or_summary)
    else:
        summary = queue_summary(launch_result_or_summary)
    lines = []
    for key, (label, unit) in QUEUE_SUMMARY_RU.items():
        value = summary.get(key)
        if value is None:
            text = "—"
        elif isinstance(value, bool):
            text = "да" if value else "нет"
        elif key in _TWO_DECIMALS:
            text = num(float(value), 2)
        elif key in _ONE_DECIMAL:
            text = num(float(value), 1)
        else:
            text = num(round(value))
        lines.append(f"{label}{', ' + unit if unit else ''}: {text}")
    return "\n".join(lines)
