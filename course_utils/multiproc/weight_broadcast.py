"""Урок 12.4, уровень C: версии весов рассылкой dist.broadcast в подготовительные буферы."""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import time
from typing import Any

import torch

from course_utils.args import integer, nonnegative, optional_integer, positive, text
from course_utils.multiproc.transport import (
    ROLE_GENERATOR,
    ROLE_TRAINER,
    device_sync,
    rank_results,
    shared_stages,
    state_checksum,
)
from course_utils.weight_sync import (
    DEFAULT_ATOL,
    EventLog,
    InProcessEngine,
    _logits,
    probe_input,
    transfer_weights,
)

_EXPERIMENT = "broadcast_weights"
_TRAINER = "trainer"
_MAX_SIZE = 2**26  # наибольший синтетический тензор замера, параметров (fp32: 256 МиБ)


def _trainer_update(net: torch.nn.Module, probe: torch.Tensor, lr: float) -> float:
    """Шаг SGD тренера: θ ← θ − lr·∇L, L — перекрёстная энтропия следующего токена на
    контрольном входе (нат на токен). Возвращает L."""
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

    Версия v = 1..versions: шаг SGD тренера, broadcast заголовка [v, тензоров], SHA-256, эталонных
    логитов и весов (``transfer_weights`` по ("broadcast", 0)) в подготовительные буферы;
    проверка (atol), барьер ``all_reduce(MIN)`` флагов (одна неудача — abort везде), commit,
    контрольный запрос. corrupt_version — ранг corrupt_rank портит число этой версии. sizes —
    fp32-тензоры (numel · 4 Б): медиана repeats рассылок, с. Возвращает JSON-словарь ранга.
    """
    import torch.distributed as dist

    from course_utils.multiproc import local_device
    from course_utils.policy import load_policy

    world_size = integer("world_size", world_size, 2)
    rank = integer("rank", rank, 0, world_size - 1)
    model = text("model", model)
    versions = integer("versions", versions, 1, 100)
    size_list = [integer("sizes[…]", n, 1, _MAX_SIZE) for n in sizes or []]
    seed = integer("seed", seed, 0)
    lr = positive("lr", lr)
    repeats = integer("repeats", repeats, 1, 50)
    atol = nonnegative("atol", atol)
    corrupt_version = optional_integer("corrupt_version", corrupt_version, 1, versions)
    corrupt_rank = integer("corrupt_rank", corrupt_rank, 1, world_size - 1)

    device = local_device(backend)
    t_ref = shared_stages(device).t_ref
    log = EventLog(clock=time.time, t0=t_ref)
    torch.manual_seed(seed)
    net, _, info = load_policy(model, device=device)
    is_trainer = rank == 0
    probe = probe_input(net, seed=seed).to(device)
    n_names = len(list(net.named_parameters()))
    nbytes = sum(p.numel() * p.element_size() for p in net.parameters())
    ref = torch.empty_like(_logits(net, probe))  # буфер эталонных логитов тренера
    params = dict(net.named_parameters()) if is_trainer else None
    engine = None if is_trainer else InProcessEngine(net, version=0, name=f"rank-{rank}", log=log)
    net = net if is_trainer else None  # у генератора веса — только в буферах движка
    common = {"experiment": _EXPERIMENT, "rank": rank, "world_size": world_size}
    common |= {"backend": backend, "role": ROLE_TRAINER if is_trainer else ROLE_GENERATOR}
    common |= {"pid": os.getpid(), "hostname": socket.gethostname(), "device": str(device)}
    common |= {"model": info.describe(), "num_params": info.num_params, "num_tensors": n_names}
    common["t_ref_unix"] = t_ref

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
            header.copy_(torch.tensor([v, n_names], device=device))
            digest.copy_(torch.tensor(list(bytes.fromhex(expected)), dtype=torch.uint8))
            device_sync(device)
            row["update_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
        for t in (header, digest, ref):
            dist.broadcast(t, src=0)
        got_version, n_tensors = header.tolist()
        if not is_trainer:
            row["wait_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            if n_tensors != n_names:
                raise RuntimeError(
                    f"ранг {rank}: тренер шлёт {n_tensors} тензоров, у модели генератора {n_names}"
                )
            expected = bytes(digest.cpu().tolist()).hex()
        with contextlib.nullcontext() if is_trainer else engine.staging(got_version) as buffers:
            for _ in transfer_weights(params, buffers, ("broadcast", 0)):
                pass
            device_sync(device)
        row["broadcast_s"] = time.perf_counter() - t0

        ok = True
        if not is_trainer:
            if corrupt_version == v and rank == corrupt_rank:
                engine.corrupt_staging()
            t0 = time.perf_counter()
            res = engine.verify(expected, probe, ref, atol)
            row["verify_s"] = time.perf_counter() - t0
            row |= {"checksum_ok": res.checksum_ok, "logits_ok": res.logits_ok}
            row["max_abs_diff"] = res.max_abs_diff
            ok = res.ok
            if ok:
                engine.ready()
        t0 = time.perf_counter()
        flag = torch.tensor([int(ok)], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # барьер готовности: ждёт всех
        row["barrier_s"] = time.perf_counter() - t0
        row["committed"] = all_ok = bool(flag.item())

        t0 = time.perf_counter()
        who = _TRAINER if is_trainer else engine.name
        if all_ok:
            log.add("barrier", who, got_version, detail=f"готовы все генераторы: {world_size - 1}")
            version = got_version if is_trainer else engine.commit()
        else:
            log.add("abort", who, got_version, detail="проверка не прошла хотя бы на одном ранге")
            if engine is not None:
                engine.discard_staging()
        dist.barrier()  # все переключились (или все отказались) — приём запросов возобновлён
        row["commit_s"] = time.perf_counter() - t0

        # Контрольный запрос: какую версию генератор реально обслуживает.
        answer = torch.tensor([version, 1], dtype=torch.int64, device=device)
        if engine is not None:
            served = engine.forward(probe, request_id=f"{engine.name}/probe-v{v}")
            match = bool((served.logits - ref).abs().max().item() <= atol)
            answer = torch.tensor([served.version, int(match)], dtype=torch.int64, device=device)
        gathered = [torch.zeros_like(answer) for _ in range(world_size)]
        dist.all_gather(gathered, answer)
        answers = [a.tolist() for a in gathered]
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
        seconds = statistics.median(times)
        size_rows.append({"size": n, "bytes": 4 * n, "seconds": seconds, "times_s": times})

    final = {"final_version": version if is_trainer else engine.version}
    final["checksum"] = state_checksum(net) if is_trainer else engine.active_checksum
    return {**common, **final, "versions": rows, "sizes": size_rows, "events": log.to_list()}


# ----------------------------------------------------------------------------- таблицы


def sync_frame(launch_result: Any):
    """Таблица pandas публикаций: строка на (версия, ранг); время — с, объём — байты."""
    import pandas as pd

    rows = [
        {"rank": res["rank"], "role": res["role"], **v}
        for res in rank_results(launch_result, _EXPERIMENT)
        for v in res["versions"]
    ]
    cols = ["version", "rank", "role", "bytes", "wait_s", "broadcast_s", "verify_s"]
    cols += ["barrier_s", "commit_s", "served_version", "checksum_ok", "logits_ok"]
    cols += ["max_abs_diff", "committed", "served_matches_reference"]
    frame = pd.DataFrame(rows).reindex(columns=cols)
    return frame.sort_values(["version", "rank"]).reset_index(drop=True)


def sync_size_frame(launch_result: Any):
    """Время рассылки от размера: size — параметров, bytes — байт (fp32), seconds — медиана у
    самого медленного генератора, с; trainer_s — у тренера; gib_per_s = bytes / 2^30 / seconds."""
    import pandas as pd

    by_size: dict[int, dict] = {}
    for res in rank_results(launch_result, _EXPERIMENT):
        for s in res.get("sizes", []):
            row = by_size.setdefault(s["size"], {"size": s["size"], "bytes": s["bytes"]})
            row["repeats"] = len(s.get("times_s", [])) or None
            if res["role"] == ROLE_TRAINER:
                row["trainer_s"] = s["seconds"]
            else:
                row["seconds"] = max(row.get("seconds", 0.0), s["seconds"])
    cols = ["size", "bytes", "seconds", "trainer_s", "repeats"]
    frame = pd.DataFrame(sorted(by_size.values(), key=lambda r: r["size"]), columns=cols)
    return frame.assign(gib_per_s=frame["bytes"] / 2**30 / frame["seconds"])


def merged_events(launch_result: Any) -> list[dict]:
    """Общий журнал всех рангов, упорядоченный по t (одна машина — одни часы) — для audit_log."""
    events = [
        dict(e) for res in rank_results(launch_result, _EXPERIMENT) for e in res.get("events", [])
    ]
    events.sort(key=lambda e: e["t"])
    return [e | {"seq": i} for i, e in enumerate(events)]
