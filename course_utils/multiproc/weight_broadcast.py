"""Урок 12.4, уровень C: версии весов рассылкой dist.broadcast в подготовительные буферы."""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from course_utils.args import (
    integer,
    nonnegative,
    optional_integer,
    positive,
    text,
)
from course_utils.multiproc.transport import (
    ROLE_GENERATOR,
    ROLE_TRAINER,
    device_sync,
    rank_results,
    shared_time_ref,
    state_checksum,
)
from course_utils.weight_sync import (
    DEFAULT_ATOL,
    MAX_SIZE,
    TRAINER,
    EventLog,
    InProcessEngine,
    _logits,
    _named_params,
    probe_input,
)

BROADCAST_EXPERIMENT = "broadcast_weights"


def _hex_tensor(checksum: str, device) -> torch.Tensor:
    return torch.tensor(list(bytes.fromhex(checksum)), dtype=torch.uint8, device=device)


def _check_sizes(sizes: Any) -> list[int]:
    if sizes is None:
        return []
    if isinstance(sizes, str | bytes) or not isinstance(sizes, Sequence) or not sizes:
        raise ValueError(
            f"sizes должно быть непустым списком чисел параметров или None, получено {sizes!r}"
        )
    return [integer("sizes[…]", s, 1, MAX_SIZE) for s in sizes]


def _trainer_update(net: torch.nn.Module, probe: torch.Tensor, lr: float) -> float:
    """Настоящий шаг SGD тренера: языковая функция потерь на контрольном входе. Возвращает loss."""
    net.zero_grad(set_to_none=True)
    with torch.enable_grad():
        kwargs = {"use_cache": False} if hasattr(net, "config") else {}
        out = net(probe, **kwargs)
        logits = getattr(out, "logits", out)
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(), probe[:, 1:].reshape(-1)
        )
        loss.backward()
    with torch.no_grad():
        for p in net.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
    net.zero_grad(set_to_none=True)
    return float(loss)


def broadcast_weights(
    rank: int,
    world_size: int,
    backend: str,
    model: str = "tiny",
    versions: int = 3,
    sizes: list[int] | None = None,
    seed: int = 0,
    lr: float = 0.05,
    repeats: int = 3,
    atol: float = DEFAULT_ATOL,
    corrupt_version: int | None = None,
    corrupt_rank: int = 1,
) -> dict:
    """Публикация весов в процессах: ранг 0 — тренер, ранги 1..N−1 — генераторы (N ≥ 2).

    Версия v = 1..versions: тренер делает шаг SGD (lr) на контрольном входе, рассылает
    заголовок [v, число тензоров], SHA-256 и эталонные логиты, затем все тензоры
    (``dist.broadcast``) прямо в подготовительные буферы генераторов. Генератор проверяет
    сумму и логиты (atol), сообщает ready; барьер готовности — ``all_reduce(MIN)`` флагов
    проверки: одна неудача отменяет переключение везде. Затем commit, ``dist.barrier``
    (все переключились — приём запросов возобновлён) и контрольный запрос: генератор отвечает
    версией, которой помечен ответ, и совпали ли его логиты с эталоном (``all_gather``).
    corrupt_version — для опыта: ранг corrupt_rank портит одно число принятой версии.

    sizes — числа параметров: синтетический fp32-тензор каждого размера рассылается
    repeats раз; время — медиана, с (perf_counter, перед каждым повтором барьер).
    Байты — numel · element_size. Возвращает JSON-словарь ранга: role, pid, versions
    (строка на версию), sizes, events (журнал, t — секунды от общей точки отсчёта).
    """
    import torch.distributed as dist

    from course_utils.multiproc import local_device
    from course_utils.policy import load_policy

    world_size = integer("world_size", world_size, 2)
    rank = integer("rank", rank, 0, world_size - 1)
    model = text("model", model)
    versions = integer("versions", versions, 1, 100)
    size_list = _check_sizes(sizes)
    seed = integer("seed", seed, 0)
    lr = positive("lr", lr)
    repeats = integer("repeats", repeats, 1, 50)
    atol = nonnegative("atol", atol)
    corrupt_version = optional_integer("corrupt_version", corrupt_version, 1, versions)
    corrupt_rank = integer("corrupt_rank", corrupt_rank, 1, world_size - 1)

    device = local_device(backend)
    t_ref = shared_time_ref(device)
    log = EventLog(clock=time.time, t0=t_ref)
    torch.manual_seed(seed)
    net, _, info = load_policy(model, device=device)
    is_trainer = rank == 0
    probe = probe_input(net, seed=seed).to(device)
    names = list(_named_params(net))
    nbytes = sum(p.numel() * p.element_size() for p in net.parameters())
    engine = None
    if not is_trainer:
        engine = InProcessEngine(net, version=0, name=f"rank-{rank}", log=log)
        del net
    ref = torch.empty_like(_logits(engine._models[0] if engine else net, probe))
    common = {
        "experiment": BROADCAST_EXPERIMENT,
        "rank": rank,
        "world_size": world_size,
        "backend": backend,
        "role": ROLE_TRAINER if is_trainer else ROLE_GENERATOR,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "device": str(device),
        "model": info.describe(),
        "num_params": info.num_params,
        "num_tensors": len(names),
        "t_ref_unix": t_ref,
    }

    dist.barrier()  # все загрузили модель: время первой версии не включает загрузку соседей
    rows = []
    version = 0
    for v in range(1, versions + 1):
        row: dict[str, Any] = {"version": v, "bytes": nbytes}
        header = torch.zeros(2, dtype=torch.int64, device=device)
        digest = torch.zeros(32, dtype=torch.uint8, device=device)
        t0 = time.perf_counter()
        if is_trainer:
            row["loss"] = _trainer_update(net, probe, lr)
            expected = state_checksum(net)
            ref.copy_(_logits(net, probe))
            header.copy_(torch.tensor([v, len(names)], device=device))
            digest.copy_(_hex_tensor(expected, device))
            device_sync(device)
            row["update_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
        dist.broadcast(header, src=0)
        dist.broadcast(digest, src=0)
        dist.broadcast(ref, src=0)
        got_version, n_tensors = (int(x) for x in header.tolist())
        if not is_trainer:
            row["wait_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            if n_tensors != len(names):
                raise RuntimeError(
                    f"ранг {rank}: тренер шлёт {n_tensors} тензоров, у модели генератора {len(names)}"
                )
            expected = bytes(digest.cpu().tolist()).hex()
        if is_trainer:
            for p in net.parameters():
                dist.broadcast(p.data, src=0)
            device_sync(device)
        else:
            with engine.staging(got_version) as buffers:
                for name in names:
                    dist.broadcast(buffers[name], src=0)
                device_sync(device)
        row["broadcast_s"] = time.perf_counter() - t0

        ok = True
        if not is_trainer:
            if corrupt_version == v and rank == corrupt_rank:
                engine.corrupt_staging()
            t0 = time.perf_counter()
            res = engine.verify(expected, probe, ref, atol)
            row["verify_s"] = time.perf_counter() - t0
            row.update(checksum_ok=res.checksum_ok, logits_ok=res.logits_ok)
            row["max_abs_diff"] = res.max_abs_diff
            ok = res.ok
            if ok:
                engine.ready()
        t0 = time.perf_counter()
        flag = torch.tensor([1 if ok else 0], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # барьер готовности: ждёт всех
        all_ok = bool(flag.item())
        row["barrier_s"] = time.perf_counter() - t0
        row["committed"] = all_ok

        t0 = time.perf_counter()
        who = TRAINER if is_trainer else engine.name
        if all_ok:
            log.add("barrier", who, got_version, detail=f"готовы все генераторы: {world_size - 1}")
            if engine is not None:
                engine.commit()
            else:
                version = got_version
        else:
            log.add("abort", who, got_version, detail="проверка не прошла хотя бы на одном ранге")
            if engine is not None:
                engine.discard_staging()
        dist.barrier()  # все переключились (или все отказались) — приём запросов возобновлён
        row["commit_s"] = time.perf_counter() - t0

        # Контрольный запрос: какую версию генератор реально обслуживает.
        if engine is not None:
            served = engine.forward(probe, request_id=f"{engine.name}/probe-v{v}")
            match = bool((served.logits - ref).abs().max().item() <= atol)
            answer = torch.tensor([served.version, int(match)], dtype=torch.int64, device=device)
        else:
            answer = torch.tensor([version, 1], dtype=torch.int64, device=device)
        gathered = [torch.zeros_like(answer) for _ in range(world_size)]
        dist.all_gather(gathered, answer)
        answers = [tuple(int(x) for x in a.tolist()) for a in gathered]
        row["served_version"] = answers[rank][0]
        row["served_matches_reference"] = None if is_trainer else bool(answers[rank][1])
        if is_trainer:
            row["published_version"] = got_version
            row["generators_served"] = [a[0] for a in answers[1:]]
        rows.append(row)

    size_rows = []
    for n in size_list:
        buf = torch.zeros(n, dtype=torch.float32, device=device)
        if is_trainer:
            buf.copy_(torch.randn(n, generator=torch.Generator().manual_seed(seed + n)))
        dist.broadcast(buf, src=0)  # прогрев
        times = []
        for _ in range(repeats):
            dist.barrier()
            device_sync(device)
            t0 = time.perf_counter()
            dist.broadcast(buf, src=0)
            device_sync(device)
            times.append(time.perf_counter() - t0)
        size_rows.append(
            {
                "size": n,
                "bytes": n * buf.element_size(),
                "seconds": statistics.median(times),
                "times_s": times,
            }
        )

    final = {"final_version": version if is_trainer else engine.version}
    final["checksum"] = state_checksum(net) if is_trainer else engine.active_checksum
    return {**common, **final, "versions": rows, "sizes": size_rows, "events": log.to_list()}


# ----------------------------------------------------------------------------- таблицы


def sync_frame(launch_result: Any):
    """Таблица pandas публикаций: строка на (версия, ранг); время — секунды, объём — байты.

    Столбцы: version, rank, role, bytes, wait_s, broadcast_s, verify_s, barrier_s,
    commit_s, served_version, checksum_ok, logits_ok, max_abs_diff, committed,
    served_matches_reference. У тренера verify_s и проверки пусты (NaN).
    """
    import pandas as pd

    rows = []
    for res in rank_results(launch_result, BROADCAST_EXPERIMENT):
        for v in res["versions"]:
            rows.append({"rank": res["rank"], "role": res["role"], **v})
    cols = ["version", "rank", "role", "bytes", "wait_s", "broadcast_s", "verify_s"]
    cols += ["barrier_s", "commit_s", "served_version", "checksum_ok", "logits_ok"]
    cols += ["max_abs_diff", "committed", "served_matches_reference"]
    frame = pd.DataFrame(rows)
    for c in cols:
        if c not in frame:
            frame[c] = None
    return frame[cols].sort_values(["version", "rank"]).reset_index(drop=True)


def sync_size_frame(launch_result: Any):
    """Время рассылки от размера: строка на размер. size — параметров, bytes — байт (fp32),
    seconds — медиана у самого медленного генератора, с; trainer_s — у тренера, с;
    gib_per_s — bytes / 2^30 / seconds (ГиБ/с, один получатель); repeats — повторов на размер.
    """
    import pandas as pd

    by_size: dict[int, dict] = {}
    for res in rank_results(launch_result, BROADCAST_EXPERIMENT):
        for s in res.get("sizes", []):
            row = by_size.setdefault(s["size"], {"size": s["size"], "bytes": s["bytes"]})
            row["repeats"] = len(s.get("times_s", [])) or None
            if res["role"] == ROLE_TRAINER:
                row["trainer_s"] = s["seconds"]
            else:
                row["seconds"] = max(row.get("seconds", 0.0), s["seconds"])
    frame = pd.DataFrame(
        sorted(by_size.values(), key=lambda r: r["size"]),
        columns=["size", "bytes", "seconds", "trainer_s", "repeats"],
    )
    frame["gib_per_s"] = frame["bytes"] / 2**30 / frame["seconds"]
    return frame


def merged_events(launch_result: Any) -> list[dict]:
    """Общий журнал всех рангов, упорядоченный по t (одна машина — одни часы) — для audit_log."""
    events = []
    for res in rank_results(launch_result, BROADCAST_EXPERIMENT):
        events.extend(dict(e) for e in res.get("events", []))
    events.sort(key=lambda e: e["t"])
    for i, e in enumerate(events):
        e["seq"] = i
    return events
