"""Урок 12.4, уровень C: версии весов рассылкой dist.broadcast в подготовительные буферы."""

from __future__ import annotations

import contextlib
import socket
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from course_utils.args import integer, nonnegative, optional_integer, positive, text
from course_utils.multiproc import transport
from course_utils.multiproc.transport import (
    ROLE_GENERATOR,
    ROLE_TRAINER,
    device_sync,
    rank_results,
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

    r = transport.start_rank(_EXPERIMENT, dict(locals()))  # проверенные аргументы
    me = _Rank(r, seed, atol)
    head = {k: v for k, v in r.head.items() if k != "clock_note"}  # часы журнала — time.time
    head |= {"role": ROLE_TRAINER if me.is_trainer else ROLE_GENERATOR}
    head |= {"hostname": socket.gethostname(), "num_tensors": me.n_names, "t_ref_unix": me.t_ref}
    dist.barrier()  # все загрузили модель: время первой версии не включает загрузку соседей
    rows = [
        me.publish(v, lr, corrupt=(v, rank) == (corrupt_version, corrupt_rank))
        for v in range(1, versions + 1)
    ]
    size_rows = [_time_broadcast(n, r.device, me.is_trainer, seed, repeats) for n in size_list]
    if me.is_trainer:
        final = {"final_version": me.version, "checksum": state_checksum(me.net)}
    else:
        final = {"final_version": me.engine.version, "checksum": me.engine.active_checksum}
    return {**head, **final, "versions": rows, "sizes": size_rows, "events": me.log.to_list()}


class _Rank:
    """Ранг рассылки: тренер (ранг 0) публикует версии весов, генератор принимает их движком."""

    def __init__(self, r, seed: int, atol: float) -> None:
        net, self.device, self.atol = r.net, r.device, atol
        self.rank, self.world_size = r.head["rank"], r.head["world_size"]
        self.t_ref = r.stages.t0  # общая точка отсчёта, с (time.time() ранга 0)
        self.log = EventLog(clock=time.time, t0=self.t_ref)
        self.is_trainer = self.rank == 0
        self.probe = probe_input(net, seed=seed).to(self.device)
        self.ref = torch.empty_like(_logits(net, self.probe))  # эталонные логиты тренера
        self.n_names = len(list(net.named_parameters()))
        self.nbytes = sum(p.numel() * p.element_size() for p in net.parameters())
        self.version = 0  # опубликованная версия (у тренера)
        if self.is_trainer:
            self.net, self.engine = net, None
        else:  # у генератора веса — только в буферах движка
            self.net, self.engine = None, InProcessEngine(net, 0, f"rank-{self.rank}", self.log)

    def publish(self, v: int, lr: float, corrupt: bool) -> dict:
        """Версия v → строка ранга: рассылка, проверка, барьер, commit/abort, контрольный запрос."""
        row: dict[str, Any] = {"version": v, "bytes": self.nbytes}
        got, expected = self._broadcast(v, lr, row)
        ok = self.is_trainer or self._verify(expected, corrupt, row)
        self._commit(got, ok, row)
        return row | self._probe(v, got)

    def _broadcast(self, v: int, lr: float, row: dict) -> tuple[int, str]:
        """Заголовок, SHA-256, эталон и веса от тренера в буферы → (версия, ожидаемая сумма)."""
        header = torch.zeros(2, dtype=torch.int64, device=self.device)
        digest = torch.zeros(32, dtype=torch.uint8, device=self.device)
        t0 = time.perf_counter()
        if self.is_trainer:
            row["loss"] = _trainer_update(self.net, self.probe, lr)
            checksum = bytes.fromhex(state_checksum(self.net))
            self.ref.copy_(_logits(self.net, self.probe))
            header.copy_(torch.tensor([v, self.n_names], device=self.device))
            digest.copy_(torch.tensor(list(checksum), dtype=torch.uint8))
            device_sync(self.device)
            row["update_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
        for t in (header, digest, self.ref):
            dist.broadcast(t, src=0)
        got, n_tensors = header.tolist()
        if not self.is_trainer:
            row["wait_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            if n_tensors != self.n_names:
                raise RuntimeError(
                    f"ранг {self.rank}: тренер шлёт {n_tensors} тензоров, у модели генератора "
                    f"{self.n_names}"
                )
        params = dict(self.net.named_parameters()) if self.is_trainer else None
        with contextlib.nullcontext() if self.is_trainer else self.engine.staging(got) as buffers:
            for _ in transfer_weights(params, buffers, ("broadcast", 0)):
                pass
            device_sync(self.device)
        row["broadcast_s"] = time.perf_counter() - t0
        return got, bytes(digest.cpu().tolist()).hex()

    def _verify(self, expected: str, corrupt: bool, row: dict) -> bool:
        """Генератор: SHA-256 и логиты буферов против тренера (atol); прошёл — engine.ready()."""
        if corrupt:
            self.engine.corrupt_staging()
        t0 = time.perf_counter()
        res = self.engine.verify(expected, self.probe, self.ref, self.atol)
        row["verify_s"] = time.perf_counter() - t0
        row |= {"checksum_ok": res.checksum_ok, "logits_ok": res.logits_ok}
        row["max_abs_diff"] = res.max_abs_diff
        if res.ok:
            self.engine.ready()
        return res.ok

    def _commit(self, got: int, ok: bool, row: dict) -> None:
        """Барьер all_reduce(MIN) флагов готовности: готовы все — commit, иначе abort везде."""
        t0 = time.perf_counter()
        flag = torch.tensor([int(ok)], dtype=torch.int64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # барьер готовности: ждёт всех
        row["barrier_s"] = time.perf_counter() - t0
        row["committed"] = all_ok = bool(flag.item())
        t0 = time.perf_counter()
        who = _TRAINER if self.is_trainer else self.engine.name
        if all_ok:
            ready = f"готовы все генераторы: {self.world_size - 1}"
            self.log.add("barrier", who, got, detail=ready)
            self.version = got if self.is_trainer else self.engine.commit()
        else:
            self.log.add("abort", who, got, detail="проверка не прошла хотя бы на одном ранге")
            if self.engine is not None:
                self.engine.discard_staging()
        dist.barrier()  # все переключились (или все отказались) — приём запросов возобновлён
        row["commit_s"] = time.perf_counter() - t0

    def _probe(self, v: int, got: int) -> dict:
        """Контрольный запрос: какую версию реально обслуживает каждый генератор."""
        if self.is_trainer:
            answer = [self.version, 1]
        else:
            served = self.engine.forward(self.probe, request_id=f"{self.engine.name}/probe-v{v}")
            match = bool((served.logits - self.ref).abs().max().item() <= self.atol)
            answer = [served.version, int(match)]
        mine = torch.tensor(answer, dtype=torch.int64, device=self.device)
        gathered = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine)
        out = {"served_version": answer[0], "served_matches_reference": None}
        if self.is_trainer:
            out["published_version"] = got
            out["generators_served"] = [a.tolist()[0] for a in gathered[1:]]
        else:
            out["served_matches_reference"] = bool(answer[1])
        return out


def _time_broadcast(n: int, device, is_trainer: bool, seed: int, repeats: int) -> dict:
    """Рассылка fp32-тензора из n параметров (4·n Б): медиана repeats замеров после прогрева, с."""
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
    return {"size": n, "bytes": 4 * n, "seconds": statistics.median(times), "times_s": times}


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
