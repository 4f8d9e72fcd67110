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
import numbers
import os
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
    "RecvStats",
    "send_object",
    "recv_object",
    "send_tensors",
    "recv_tensors",
    "state_checksum",
    "sync_generator_trainer",
    "sync_steps_frame",
    "events_frame",
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


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_peer(name: str, peer: Any) -> int:
    """Проверяет номер ранга-собеседника: группа создана, 0 ≤ peer < world_size, peer ≠ свой."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed не инициализирован: функцию вызывают внутри процесса, "
            "запущенного multiproc.launch или torchrun"
        )
    world, me = dist.get_world_size(), dist.get_rank()
    if not _is_int(peer) or not 0 <= peer < world:
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


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def send_object(obj: Any, dst: int, device: Any = "cpu") -> int:
    """Отправляет JSON-сериализуемый объект рангу dst; возвращает размер полезной нагрузки, байт.

    Два сообщения: длина n (один int64), затем n байт UTF-8 (uint8) на устройстве device
    (на NCCL — GPU своего ранга). Получатель вызывает ``recv_object(src=<этот ранг>)``.
    """
    import torch
    import torch.distributed as dist

    dst = _check_peer("dst", dst)
    dev = _device(device)
    try:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"obj должен быть JSON-сериализуемым: {exc}") from exc
    dist.send(torch.tensor([len(data)], dtype=torch.int64, device=dev), dst=dst)
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
    dist.send(payload, dst=dst)
    _sync(dev)
    return len(data)


def recv_object(src: int, device: Any = "cpu") -> tuple[Any, RecvStats]:
    """Принимает объект от ``send_object`` ранга src. Возвращает (объект, RecvStats).

    wait_s — время до прихода длины (блокировка: отправитель ещё не готов), transfer_s —
    приём байтов и разбор JSON, секунды.
    """
    import torch
    import torch.distributed as dist

    src = _check_peer("src", src)
    dev = _device(device)
    t0 = time.perf_counter()
    size = torch.zeros(1, dtype=torch.int64, device=dev)
    dist.recv(size, src=src)
    n = int(size.item())  # .item() ждёт данные и на GPU
    t1 = time.perf_counter()
    payload = torch.empty(n, dtype=torch.uint8, device=dev)
    dist.recv(payload, src=src)
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
    _sync(dev)
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
    _sync(dev)
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

    def add(self, stage: str, step: int | None, wall_start: float, duration_s: float) -> None:
        start = wall_start - self.t_ref
        self.events.append(
            {"stage": stage, "step": step, "start_s": start, "end_s": start + duration_s}
        )

    @contextlib.contextmanager
    def stage(self, stage: str, step: int | None = None) -> Iterator[_Span]:
        span = _Span()
        _sync(self.device)
        wall0, t0 = time.time(), time.perf_counter()
        try:
            yield span
        finally:
            _sync(self.device)
            span.duration_s = time.perf_counter() - t0
            self.add(stage, step, wall0, span.duration_s)


def _shared_time_ref(device) -> float:
    """Общая точка отсчёта времени: time.time() ранга 0, разосланная всем (broadcast), с."""
    import torch
    import torch.distributed as dist

    ref = torch.tensor([time.time()], dtype=torch.float64, device=device)
    dist.broadcast(ref, src=0)
    return float(ref.item())


# ----------------------------------------------------------------------------- урок 12.1


def _check_int(name: str, value: Any, low: int) -> None:
    if not _is_int(value) or value < low:
        raise ValueError(f"{name} должно быть целым ≥ {low}, получено {value!r}")


def _check_sync_args(world_size, steps, prompts_per_step, group_size, max_new_tokens, lr, seed):
    if world_size != 2:
        raise ValueError(
            f"sync_generator_trainer: нужно ровно 2 процесса (ранг {GENERATOR_RANK} — генератор, "
            f"ранг {TRAINER_RANK} — тренер), а world_size={world_size}; запустите nprocs=2"
        )
    _check_int("steps", steps, 1)
    _check_int("prompts_per_step", prompts_per_step, 1)
    _check_int("group_size", group_size, 1)
    _check_int("max_new_tokens", max_new_tokens, 1)
    _check_int("seed", seed, 0)
    if not _is_real(lr) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr должно быть конечным числом > 0, получено {lr!r}")


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
    _check_sync_args(world_size, steps, prompts_per_step, group_size, max_new_tokens, lr, seed)
    if not _is_real(temperature) or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature должна быть конечным числом > 0, получено {temperature!r}")
    if not isinstance(verify, bool):
        raise ValueError(f"verify должно быть True или False, получено {verify!r}")
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"model должно быть непустой строкой, получено {model!r}")
    if rank not in (GENERATOR_RANK, TRAINER_RANK):
        raise ValueError(f"rank должно быть 0 (генератор) или 1 (тренер), получено {rank!r}")

    import torch

    from course_utils.multiproc import local_device
    from course_utils.policy import load_policy

    device = local_device(backend)
    t_ref = _shared_time_ref(device)
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
    from course_utils.policy import grpo_step, recompute_logprobs

    wire_dtype = next(net.parameters()).dtype  # веса уходят движку в его типе
    trainer = net.float()
    amp = wire_dtype if device.type == "cuda" and wire_dtype != torch.float32 else None
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
            stats = grpo_step(trainer, optimizer, records, old, autocast_dtype=amp)
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
}


def events_frame(launch_result: Any, by_kind: bool = False):
    """События обоих процессов для ``tracing.gantt``: worker ("генератор"/"тренер"), stage,
    start_s, end_s, duration_s (секунды от общей точки отсчёта, см. ``CLOCK_NOTE``), step, rank.

    ``by_kind=True`` заменяет имя стадии её видом из ``STAGE_KINDS_RU`` (генерация, обучение,
    передача, ожидание, …); исходное имя остаётся в столбце ``detail``.
    """
    import pandas as pd

    by_role = _results_by_role(launch_result, "launch_result")
    rows = []
    for role in (ROLE_GENERATOR, ROLE_TRAINER):
        res = by_role[role]
        for ev in res.get("events", []):
            rows.append(
                {
                    "trace_id": None,
                    "worker": role,
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
