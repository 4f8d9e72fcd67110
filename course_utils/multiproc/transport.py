"""Уровень C: обмен между рангами (JSON-объекты, именованные тензоры), SHA-256 весов, общие часы
и общие части точек входа с RL-циклом (старт ранга, fp32-тренер, генерация, проверка записей)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from course_utils.args import integer
from course_utils.tracing import StageTimer, cuda_sync_or_none

ROLE_GENERATOR = "генератор"
ROLE_TRAINER = "тренер"
CLOCK_NOTE = (
    "start_s/end_s событий — секунды от общей точки отсчёта (time.time() ранга 0) по одним часам "
    "perf_counter, привязанным к ней один раз для всех процессов; события разных процессов "
    "сравнимы только на одной машине"
)


# ----------------------------------------------------------------------------- обмен между рангами


@dataclass
class _RecvStats:
    """Замер приёма: байты нагрузки; ожидание первого сообщения и приём остального, с; отправитель."""

    nbytes: int
    wait_s: float
    transfer_s: float
    src: int = -1


def _check_peer(name: str, peer: Any) -> int:
    """Номер ранга-собеседника: группа создана, 0 ≤ peer < world_size, peer ≠ свой."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed не инициализирован: функцию вызывают внутри процесса, "
            "запущенного multiproc.launch или torchrun"
        )
    peer = integer(name, peer, 0, dist.get_world_size() - 1)
    if peer == dist.get_rank():
        raise ValueError(f"{name}={peer} совпадает с собственным рангом: отправить себе нельзя")
    return peer


def device_sync(device) -> None:
    """Ждёт завершения работы CUDA на device (до замера времени); на CPU ничего не делает."""
    if sync := cuda_sync_or_none(device):
        sync()


def send_object(obj: Any, dst: int, device: Any = "cpu", group: Any = None) -> int:
    """JSON-объект рангу dst: длина n (int64), затем n байт UTF-8 на device; возвращает n, байт."""
    import torch
    import torch.distributed as dist

    dst = _check_peer("dst", dst)
    dev = torch.device(device)
    try:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"obj должен быть JSON-сериализуемым: {exc}") from exc
    dist.send(torch.tensor([len(data)], dtype=torch.int64, device=dev), dst=dst, group=group)
    dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev), dst=dst, group=group)
    device_sync(dev)
    return len(data)


def recv_object(src: int | None, device: Any = "cpu", group: Any = None):
    """Объект от ``send_object`` ранга src → (объект, _RecvStats); src=None — от любого ранга
    (только gloo), отправитель — в _RecvStats.src."""
    import torch
    import torch.distributed as dist

    src = None if src is None else _check_peer("src", src)
    dev = torch.device(device)
    t0 = time.perf_counter()
    size = torch.zeros(1, dtype=torch.int64, device=dev)
    src = int(dist.recv(size, src=src, group=group))
    n = int(size.item())  # .item() ждёт данные и на GPU
    t1 = time.perf_counter()
    payload = torch.empty(n, dtype=torch.uint8, device=dev)
    dist.recv(payload, src=src, group=group)
    obj = json.loads(payload.cpu().numpy().tobytes().decode("utf-8"))
    return obj, _RecvStats(n, t1 - t0, time.perf_counter() - t1, src)


def named_tensors(tensors: Any, name: str) -> dict:
    """Словарь имя → тензор из модели (named_parameters) или непустого отображения."""
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

    dt = getattr(torch, value, None) if isinstance(value, str) else value
    if value is not None and not isinstance(dt, torch.dtype):
        raise ValueError(f"{name}: неизвестный тип тензора {value!r}")
    return dt


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def _specs(tensors: Mapping, dtype=None) -> list:
    """Заголовок тензоров: [имя, форма, тип] — тип dtype на проводе или свой."""
    return [[n, list(t.shape), _dtype_name(dtype or t.dtype)] for n, t in tensors.items()]


def send_tensors(tensors, dst: int, device="cpu", meta: Mapping | None = None, wire_dtype=None):
    """Именованные тензоры рангу dst: заголовок ``send_object`` (meta, имена, формы, типы),
    затем ``transfer_weights`` по ("send", dst) в типе wire_dtype (None — свой).
    Возвращает байты Σ numel · element_size(wire_dtype), без заголовка."""
    import torch

    from course_utils.weight_sync import transfer_weights

    named = named_tensors(tensors, "tensors")
    dst = _check_peer("dst", dst)
    dev = torch.device(device)
    wire = _dtype("wire_dtype", wire_dtype)
    total = sum(t.numel() * (wire or t.dtype).itemsize for t in named.values())
    send_object(
        {"meta": dict(meta or {}), "tensors": _specs(named, wire), "nbytes": total}, dst, dev
    )
    for _ in transfer_weights(named, None, ("send", dst), device=dev, dtype=wire):
        pass
    device_sync(dev)
    return int(total)


def recv_tensors(src: int, device="cpu", buffers: Mapping | None = None):
    """Тензоры от ``send_tensors`` → (meta, {имя: тензор}, _RecvStats); buffers — готовые буферы
    приёма (имена, формы и типы = заголовку), без них буферы создаются на device."""
    import torch

    from course_utils.weight_sync import transfer_weights

    src = _check_peer("src", src)
    dev = torch.device(device)
    header, head_stats = recv_object(src, dev)
    t0 = time.perf_counter()
    specs = header["tensors"]
    if buffers is None:
        out = {
            n: torch.empty(shape, dtype=_dtype("dtype", dt), device=dev) for n, shape, dt in specs
        }
    else:
        out = named_tensors(buffers, "buffers")
        if sorted(_specs(out)) != sorted(specs):
            raise ValueError(
                "buffers: имена, формы или типы буферов не совпадают с заголовком отправителя"
            )
    out = {n: out[n] for n, _, _ in specs}  # порядок отправителя
    for _ in transfer_weights(None, out, ("recv", src)):
        pass
    device_sync(dev)
    transfer_s = head_stats.transfer_s + time.perf_counter() - t0
    stats = _RecvStats(int(header["nbytes"]), head_stats.wait_s, transfer_s)
    return dict(header["meta"]), out, stats


def state_checksum(tensors: Any, dtype: Any = None) -> str:
    """SHA-256 (hex) имён, форм, типов и байтов тензоров (модель или словарь) в порядке имён:
    равные суммы — побитно равные веса; dtype — привести тип (fp32 тренера против bf16 движка)."""
    import torch

    named = named_tensors(tensors, "tensors")
    dt = _dtype("dtype", dtype)
    h = hashlib.sha256()
    with torch.no_grad():
        for name in sorted(named):
            t = named[name].detach().to(dt or named[name].dtype).contiguous().cpu()
            h.update(f"{name}|{list(t.shape)}|{_dtype_name(t.dtype)}\n".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------- замер этапов


def shared_stages(device) -> StageTimer:
    """Таймер этапов на общей шкале: ранг 0 рассылает (time.time(), perf_counter()), с; часы
    ранга — perf_counter() + сдвиг, поэтому процессы одной машины читают одну шкалу."""
    import torch
    import torch.distributed as dist

    ref = torch.tensor([time.time(), time.perf_counter()], dtype=torch.float64, device=device)
    dist.broadcast(ref, src=0)
    wall, perf = ref.tolist()
    anchor = wall - perf  # с

    def clock() -> float:
        return time.perf_counter() + anchor

    return StageTimer(None, cuda_sync_or_none(device), clock, t0=wall)


# ----------------------------------------------------------------------------- общее для RL-циклов


def start_rank(experiment: str, cfg: dict) -> SimpleNamespace:
    """Старт ранга: устройство, общие часы, модель и шапка результата (pid, модель, часы)."""
    import torch

    from course_utils.multiproc.launcher import local_device
    from course_utils.policy import load_policy

    device = local_device(cfg["backend"])
    stages = shared_stages(device)
    torch.manual_seed(cfg["seed"])
    with stages.stage("load_model"):
        net, tokenizer, info = load_policy(cfg["model"], device=device)
    head = {"experiment": experiment, **{k: cfg[k] for k in ("rank", "world_size", "backend")}}
    head |= {"pid": os.getpid(), "device": str(device), "model": info.describe()}
    head |= {"num_params": info.num_params, "clock_note": CLOCK_NOTE}
    return SimpleNamespace(
        device=device, stages=stages, net=net, tok=tokenizer, info=info, head=head
    )


def model_card(info) -> dict:
    """Рукопожатие генератора: модель, число параметров и тип весов."""
    return {"model_id": info.model_id, "num_params": info.num_params, "dtype": info.dtype}


def check_same_model(hello: dict, info, who: str) -> None:
    """Тренер сверяет ``model_card`` генератора со своей; различие — RuntimeError."""
    mine = model_card(info)
    theirs = {k: hello.get(k) for k in mine}
    if theirs != mine:
        raise RuntimeError(f"тренер: у {who} другая модель: {theirs}, у тренера {mine}")


def sample_rollouts(engine, tok, cfg: dict, n_prompts: int, version: int, seed: int, run_id: str):
    """n_prompts · group_size роллаутов версией весов version (``generate_rollouts``)."""
    from course_utils.arith_task import make_tasks
    from course_utils.policy import generate_rollouts

    tasks = make_tasks(n_prompts, seed=seed)
    opts = {k: cfg[k] for k in ("group_size", "temperature", "max_new_tokens")}
    return generate_rollouts(
        engine, tok, tasks, policy_version=version, seed=seed, run_id=run_id, **opts
    )


def records_from(dicts: list, what: str) -> list:
    """RolloutRecord из словарей; нарушение контракта (``validate_rollout``) — ValueError."""
    from course_utils.contract import RolloutRecord, validate_rollout

    problems = [f"запись {i}: {p}" for i, d in enumerate(dicts) for p in validate_rollout(d)]
    if problems:
        raise ValueError(f"тренер: {what} нарушает контракт:\n" + "\n".join(problems[:10]))
    return [RolloutRecord.from_dict(d) for d in dicts]


def load_engine_weights(engine, buffers: dict, stages, step: int) -> float:
    """Копирует принятые буферы в параметры движка; возвращает время загрузки, с."""
    import torch

    with stages.stage("load_weights", step) as load, torch.no_grad():
        params = dict(engine.named_parameters())
        for name, buf in buffers.items():
            params[name].copy_(buf)
    return load.duration_s


def rank_results(launch_result: Any, experiment: str | None = None) -> list[dict]:
    """Словари рангов (по рангам) успешного запуска ``experiment`` (None — любой): итог
    ``multiproc.launch`` или список словарей; нужны обе роли, тренер и генератор."""
    results = getattr(launch_result, "results", launch_result)
    if getattr(launch_result, "ok", True) is False:
        summary = getattr(launch_result, "summary", lambda: "")()
        raise ValueError(f"launch_result: запуск завершился неуспешно, таблицы нет.\n{summary}")
    if isinstance(results, str | bytes) or not isinstance(results, Sequence):
        raise ValueError(
            "launch_result должно быть LaunchResult или списком словарей рангов, "
            f"получено {type(launch_result).__name__}"
        )
    ranks = [dict(r) for r in results if isinstance(r, Mapping)]
    found = sorted({str(r.get("experiment")) for r in ranks})
    mine = [r for r in ranks if experiment is None or r.get("experiment") == experiment]
    if not {ROLE_GENERATOR, ROLE_TRAINER} <= {r.get("role") for r in mine}:
        raise ValueError(
            f"launch_result: нужны результаты ролей «{ROLE_TRAINER}» и «{ROLE_GENERATOR}» "
            f"запуска {experiment or 'точки входа уровня C'}; в результате запуски: {found}"
        )
    return sorted(mine, key=lambda r: r.get("rank", 0))


# Вид работы каждой стадии — для читаемой диаграммы Ганта (5 цветов вместо 15).
_KIND_STAGES = {
    "загрузка модели": "load_model",
    "рукопожатие": "handshake",
    "генерация": "generate",
    "ожидание": "wait_rollouts wait_weights permission",
    "передача": "send_rollouts recv_rollouts send_weights recv_weights",
    "обучение": "validate logprob_recompute grpo_update train_delay",
    "проверка и загрузка весов": "checksum verify_weights load_weights snapshot_weights",
    "обратное давление": "backpressure_wait",
}
STAGE_KINDS_RU = {stage: kind for kind, names in _KIND_STAGES.items() for stage in names.split()}


def events_frame(launch_result: Any, by_kind: bool = False):
    """События всех процессов для ``tracing.gantt`` (времена — с от общей точки отсчёта);
    by_kind — стадия заменена видом из ``STAGE_KINDS_RU``, исходное имя — в столбце detail."""
    import pandas as pd

    rows = []
    for res in rank_results(launch_result):
        for ev in res.get("events", []):
            worker = ev.get("worker", res.get("worker", res["role"]))
            start, end = float(ev["start_s"]), float(ev["end_s"])
            step, rank = ev.get("step"), res.get("rank")
            rows.append((None, worker, ev["stage"], start, end, end - start, step, rank))
    columns = ["trace_id", "worker", "stage", "start_s", "end_s", "duration_s", "step", "rank"]
    frame = pd.DataFrame(rows, columns=columns)
    if by_kind:
        frame["detail"] = frame["stage"]
        frame["stage"] = frame["stage"].map(lambda s: STAGE_KINDS_RU.get(s, s))
    return frame.sort_values(["start_s", "rank"], kind="stable").reset_index(drop=True)
