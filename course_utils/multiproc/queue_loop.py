"""Урок 12.3, уровень C: тренер с очередью роллаутов (порог в токенах) и два генератора.

Точка входа ``queue_generators_trainer`` (ранг 0 — тренер с очередью, ранги 1, 2 — генераторы),
таблицы прогона ``queue_timeline_frame``, ``queue_requests_frame`` и сводка ``queue_summary`` /
``queue_summary_text``.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from course_utils.args import integer, nonnegative, positive, text
from course_utils.csv_tables import DATA_DIR, read_exact_csv
from course_utils.multiproc import transport
from course_utils.multiproc.transport import ROLE_GENERATOR, ROLE_TRAINER

QUEUE_EXPERIMENT = "queue_generators_trainer"
_TRAINER, _GENERATORS = 0, (1, 2)  # ранги
WORKER_QUEUE_RU = "очередь (ранг 0)"
_BATCH_STATS = ("loss", "clip_fraction", "grad_norm")  # итоги grpo_step в строке пакета


def _tokens(records) -> int:
    """Вес группы в очереди, токенов: Σ (запрос + ответ) по записям."""
    return sum(r.num_tokens for r in records)


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
    retry_s: float = 0.02,  # пауза генератора после отказа, с
) -> dict:
    """Асинхронный RL-цикл с очередью в токенах: ранг 0 — тренер и очередь, ранги 1, 2 — генераторы.

    Запрос разрешён, пока в очереди < T = ``max_queue_tokens`` токенов, иначе пауза ``retry_s``
    с (обратное давление); начатые запросы доходят: пик < T + работа в полёте при пересечении.
    Тренер берёт группы FIFO до ``batch_tokens``, делает ``grpo_step``, спит ``train_delay_s``
    с; версия u → u+1, задержка группы L = u − v ≥ 0. Через ``duration_s`` с — «стоп» и слив.
    Токенов/с: λ — принятый приток, λ_предл = Σ_g токены_g / время генерации_g, μ = токены
    пакетов / время занятости, ρ = λ_предл / μ; время — с от общей точки отсчёта.
    """
    if world_size != 3:
        raise ValueError(f"нужно ровно 3 процесса (тренер и 2 генератора), world_size={world_size}")
    rank = integer("rank", rank, 0, 2)
    duration_s, retry_s = positive("duration_s", duration_s), positive("retry_s", retry_s)
    max_queue_tokens = integer("max_queue_tokens", max_queue_tokens, 1)
    batch_tokens = integer("batch_tokens", batch_tokens, 1, max_queue_tokens)  # иначе ждать вечно
    prompts_per_request = integer("prompts_per_request", prompts_per_request, 1)
    group_size = integer("group_size", group_size, 1)
    max_new_tokens = integer("max_new_tokens", max_new_tokens, 1)
    train_delay_s, seed = nonnegative("train_delay_s", train_delay_s), integer("seed", seed, 0)
    model = text("model", model)
    temperature, lr = positive("temperature", temperature), positive("lr", lr)
    cfg = dict(locals())  # проверенные аргументы
    import torch.distributed as dist

    # Управляющие сообщения — на CPU: на NCCL через отдельную группу gloo (NCCL не умеет
    # «принять от любого»); веса идут основной группой.
    control = None if backend == "gloo" else dist.new_group(backend="gloo")
    r = transport.start_rank(QUEUE_EXPERIMENT, cfg)
    if rank == _TRAINER:
        who = {"role": ROLE_TRAINER, "worker": ROLE_TRAINER}
        out = _QueueTrainer(r, control, cfg).run()
    else:
        who = {"role": ROLE_GENERATOR, "worker": f"{ROLE_GENERATOR} {rank}"}
        out = _run_queue_generator(r, control, cfg)
    config = {k: v for k, v in cfg.items() if k not in ("rank", "world_size", "backend")}
    return {**r.head, **who, "config": config, **out, "events": r.stages.events}


def _run_queue_generator(r, control, cfg: dict) -> dict:
    rank, stages, engine = cfg["rank"], r.stages, r.net.eval()
    with stages.stage("handshake"):
        hello = {"type": "hello", **transport.model_card(r.info)}
        transport.send_object(hello, _TRAINER, "cpu", control)
    version, k, staging, requests, fetches = 0, 0, None, [], []
    denials_k, first_ask = 0, None  # отказов подряд у запроса k; время его первой просьбы, с
    while True:
        first_ask = stages.now() if first_ask is None else first_ask
        with stages.stage("permission", k):
            request = {"type": "request", "request_id": k, "version": version}
            transport.send_object(request, _TRAINER, "cpu", control)
            reply, _ = transport.recv_object(_TRAINER, "cpu", control)
        if reply.get("weights_follow"):
            with stages.stage("recv_weights", k):
                meta, staging, rs = transport.recv_tensors(_TRAINER, r.device, staging)
            load_s = transport.load_engine_weights(engine, staging, stages, k)
            if int(meta["version"]) <= version:
                raise RuntimeError(
                    f"генератор {rank}: пришли веса версии {meta['version']}, а у него уже "
                    f"{version} — версии должны только расти"
                )
            version = int(meta["version"])
            fetches.append(
                {"request_id": k, "version": version, "bytes": rs.nbytes, "load_s": load_s}
            )
        if reply.get("type") == "stop":
            break
        if reply.get("type") == "deny":
            denials_k += 1
            with stages.stage("backpressure_wait", k):
                time.sleep(cfg["retry_s"])
            continue
        if reply.get("type") != "grant":
            raise RuntimeError(f"генератор {rank}: неизвестный ответ тренера {reply!r}")
        granted = stages.now()
        req_seed = cfg["seed"] * 1_000_000 + rank * 100_000 + k
        with stages.stage("generate", k) as gen:
            n_prompts, run_id = cfg["prompts_per_request"], f"q{cfg['seed']}r{rank}"
            batch = transport.sample_rollouts(
                engine, r.tok, cfg, n_prompts, version, req_seed, run_id
            )
        tokens = _tokens(batch.records)
        payload = {"type": "rollouts", "request_id": k, "version": version, "tokens": tokens}
        payload.update(generate_s=gen.duration_s, records=[x.to_dict() for x in batch.records])
        with stages.stage("send_rollouts", k) as snd:
            transport.send_object(payload, _TRAINER, "cpu", control)
        row = {"request_id": k, "first_ask_s": first_ask, "granted_s": granted}
        row |= {"denials": denials_k, "gen_start_s": gen["start_s"], "gen_end_s": gen["end_s"]}
        row |= {"sent_s": snd["end_s"], "version": version, "tokens": tokens}
        requests.append(row)
        k, denials_k, first_ask = k + 1, 0, None
    waits = [ev.duration_s for ev in stages.events if ev["stage"] == "backpressure_wait"]
    return {
        "requests": requests,
        "weight_fetches": fetches,
        "n_requests": len(requests),
        "denials": len(waits),
        "backpressure_wait_s": sum(waits),
        "final_version": version,
    }


class _QueueTrainer:
    """Тренер (ранг 0): главный поток ведёт очередь под замком и зовёт torch.distributed,
    второй обучает; события очереди нумерует seq."""

    def __init__(self, r, control, cfg: dict) -> None:
        from course_utils.policy import fp32_trainer

        self.info, self.device, self.control = r.info, r.device, control
        self.stages, self.cfg = r.stages, cfg
        self.learner = fp32_trainer(r.net, r.device, cfg["lr"])
        self.cond = threading.Condition()
        self.queue: deque = deque()
        self.seq = itertools.count(1)  # номер события очереди (строки шкалы или разрешения)
        self.q_tokens, self.q_rollouts, self.version = 0, 0, 0
        self.snapshot = self.learner.wire_copy()
        self.stopping, self.error = False, None
        self.timeline, self.permissions, self.arrivals, self.batches = [], [], [], []
        self.in_flight: set[tuple[int, int]] = set()

    def _mark(self, event: str) -> dict:
        """Строка шкалы очереди: глубина (токены, роллауты, группы) после события; под замком."""
        row = {"seq": next(self.seq), "time_s": self.stages.now(), "event": event}
        row.update(depth_tokens=self.q_tokens, depth_rollouts=self.q_rollouts)
        row["depth_groups"] = len(self.queue)
        self.timeline.append(row)
        return row

    def _take_batch(self) -> tuple[list[dict] | None, float | None]:
        """Под замком: ждёт ≥ batch_tokens и снимает группы FIFO до batch_tokens → (группы,
        время снятия, с) или (None, None) при остановке."""
        while not self.stopping and self.q_tokens < self.cfg["batch_tokens"]:
            self.cond.wait(timeout=0.1)
        if self.stopping:
            return None, None
        groups: list[dict] = []
        while self.queue and sum(g["tokens"] for g in groups) < self.cfg["batch_tokens"]:
            groups.append(self.queue.popleft())
            self.q_tokens -= groups[-1]["tokens"]
            self.q_rollouts -= len(groups[-1]["records"])
        return groups, self._mark("batch")["time_s"]

    def _train_loop(self) -> None:
        try:
            for b in itertools.count():
                t0 = self.stages.now()
                with self.cond:
                    groups, pop_s = self._take_batch()
                self.stages.add("wait_rollouts", t0, self.stages.now() - t0, b)
                if groups is None:
                    return
                u, records = self.version, [rec for g in groups for rec in g["records"]]
                with self.stages.stage("grpo_update", b) as upd:
                    stats = self.learner.update(records)
                delay = 0.0
                if self.cfg["train_delay_s"] > 0:
                    with self.stages.stage("train_delay", b) as slow:
                        time.sleep(self.cfg["train_delay_s"])
                    delay = slow.duration_s
                with self.stages.stage("snapshot_weights", b):
                    snap = self.learner.wire_copy()
                lags = [u - g["version"] for g in groups]
                with self.cond:
                    self.version, self.snapshot = u + 1, snap
                    row = {"batch": b, "pop_s": pop_s, "end_s": self.stages.now(), "delay_s": delay}
                    row |= {"train_s": upd.duration_s, "tokens": sum(g["tokens"] for g in groups)}
                    row |= {"trainer_version": u, "new_version": u + 1, "lags": lags}
                    row["behavior_versions"] = [g["version"] for g in groups]
                    row["queue_wait_s"] = [pop_s - g["arrival_s"] for g in groups]
                    self.batches.append(row | {k: stats[k] for k in _BATCH_STATS})
        except BaseException as exc:  # главный поток перебросит ошибку
            with self.cond:
                self.error, self.stopping = exc, True
                self.cond.notify_all()

    # ------------------------------------------------------------------ главный поток

    def _on_request(self, src: int, msg: Mapping) -> str:
        """Разрешение, если в очереди < T токенов, иначе отказ; после остановки — «стоп»."""
        key = (src, int(msg["request_id"]))
        with self.cond:
            depth, limit = self.q_tokens, self.cfg["max_queue_tokens"]
            decision = "stop" if self.stopping else "grant" if depth < limit else "deny"
            latest, snap = self.version, self.snapshot
            follow = decision != "stop" and int(msg["version"]) < latest
            if decision == "grant":
                if key in self.in_flight:
                    raise RuntimeError(f"тренер: запрос {key} уже разрешён и ещё в полёте")
                self.in_flight.add(key)
            row = {"seq": next(self.seq), "time_s": self.stages.now(), "generator": src}
            row |= {"request_id": key[1], "decision": decision, "granted": decision == "grant"}
            row["depth_tokens"] = depth
            self.permissions.append(row)
        reply = {"type": decision, "latest_version": latest, "weights_follow": follow}
        transport.send_object(reply, src, "cpu", self.control)
        if follow:
            with self.stages.stage("send_weights", key[1], WORKER_QUEUE_RU):
                meta = {"version": latest}
                transport.send_tensors(snap, src, self.device, meta, self.learner.wire)
        return decision

    def _on_rollouts(self, src: int, msg: Mapping) -> None:
        """Проверяет группу (контракт, токены, версия) и ставит её в конец очереди."""
        key = (src, int(msg["request_id"]))
        records = transport.records_from(msg["records"], f"группа генератора {src}")
        tokens, version = _tokens(records), int(msg["version"])
        if tokens != msg.get("tokens"):
            raise RuntimeError(
                f"тренер: генератор {src} заявил {msg.get('tokens')} токенов, в записях {tokens}"
            )
        versions = {rec.policy_version for rec in records}
        if versions != {msg["version"]}:
            raise RuntimeError(
                f"тренер: версии записей {sorted(versions, key=str)} не совпадают с версией "
                f"группы {msg['version']}"
            )
        with self.cond:
            if key not in self.in_flight:
                raise RuntimeError(f"тренер: пришла группа {key}, на которую не было разрешения")
            self.in_flight.remove(key)
            self.q_tokens += tokens
            self.q_rollouts += len(records)
            row = self._mark("arrival")
            group = {"version": version, "tokens": tokens, "records": records}
            self.queue.append({**group, "arrival_s": row["time_s"]})
            arrival = {"seq": row["seq"], "time_s": row["time_s"], "generator": src}
            arrival.update(request_id=key[1], tokens=tokens, generate_s=float(msg["generate_s"]))
            self.arrivals.append(arrival)
            self.cond.notify_all()

    def _stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise RuntimeError("тренер: ошибка в потоке обучения") from self.error

    def run(self) -> dict:
        with self.stages.stage("handshake"):
            for g in _GENERATORS:
                hello, _ = transport.recv_object(g, "cpu", self.control)
                transport.check_same_model(hello, self.info, f"генератора {g}")
        with self.cond:
            start_s = self._mark("start")["time_s"]
        worker = threading.Thread(target=self._train_loop, name="trainer", daemon=True)
        worker.start()
        stopped: set[int] = set()
        stop_s = None
        while len(stopped) < len(_GENERATORS):
            msg, rs = transport.recv_object(None, "cpu", self.control)  # от любого ранга
            src = rs.src
            self._raise_if_failed()
            if stop_s is None and self.stages.now() >= start_s + self.cfg["duration_s"]:
                self._stop()
                stop_s = self.stages.now()
            kind = msg.get("type") if isinstance(msg, Mapping) else None
            if src not in _GENERATORS or src in stopped:
                raise RuntimeError(f"тренер: неожиданное сообщение от ранга {src}: {kind!r}")
            if kind == "request":
                if self._on_request(src, msg) == "stop":
                    stopped.add(src)
            elif kind == "rollouts":
                self._on_rollouts(src, msg)
            else:
                raise RuntimeError(f"тренер: неизвестный тип сообщения {kind!r} от ранга {src}")
        self._stop()
        worker.join()
        self._raise_if_failed()
        if self.in_flight:
            raise RuntimeError(f"тренер: после слива в полёте остались {sorted(self.in_flight)}")
        with self.cond:
            self._mark("end")
        return self._report(start_s, stop_s if stop_s is not None else self.stages.now())

    def _report(self, start_s: float, stop_s: float) -> dict:
        """Итог тренера: журналы очереди и скорости λ, λ_предл, μ (токенов/с), ρ, пик, задержки."""
        threshold = self.cfg["max_queue_tokens"]
        timeline = _with_in_flight(self.timeline, self.permissions, self.arrivals, threshold)
        peak = max(timeline, key=lambda row: (row["depth_tokens"], -row["seq"]))
        end_s = timeline[-1]["time_s"]
        window = end_s - start_s
        arrived = sum(a["tokens"] for a in self.arrivals)
        consumed = sum(b["tokens"] for b in self.batches)
        busy = sum(b["train_s"] + b["delay_s"] for b in self.batches)
        offered = 0.0  # λ_предл = Σ_g токены_g / время генерации_g, токенов/с
        for g in _GENERATORS:
            mine = [a for a in self.arrivals if a["generator"] == g]
            gen_s = sum(a["generate_s"] for a in mine)
            offered += sum(a["tokens"] for a in mine) / gen_s if gen_s > 0 else 0.0
        mu = consumed / busy if busy > 0 else 0.0  # μ = токены пакетов / время занятости
        lags = [lag for b in self.batches for lag in b["lags"]]
        decisions = [p["decision"] for p in self.permissions]
        crossing = peak["crossing_in_flight_tokens"]
        out = {"timeline": timeline, "arrivals": self.arrivals, "permissions": self.permissions}
        out |= {"batches": self.batches, "threshold_tokens": threshold}
        out |= {"batch_tokens": self.cfg["batch_tokens"], "start_s": start_s, "stop_s": stop_s}
        out |= {"end_s": end_s, "tokens_arrived": arrived, "tokens_consumed": consumed}
        out["left_in_queue_tokens"] = self.q_tokens
        out["busy_fraction"] = busy / window if window > 0 else 0.0
        out["lambda_tokens_per_s"] = arrived / window if window > 0 else 0.0  # λ, то же окно W
        out |= {"offered_lambda_tokens_per_s": offered, "mu_tokens_per_s": mu}
        out["rho"] = offered / mu if mu > 0 else None  # ρ = λ_предл / μ
        out["peak_depth_tokens"] = peak["depth_tokens"]
        out["overshoot_tokens"] = max(0, peak["depth_tokens"] - threshold)
        out["peak_in_flight_tokens"] = peak["in_flight_tokens"] if crossing is None else crossing
        bounds = [(r["depth_tokens"], r["bound_tokens"]) for r in timeline]
        out["bound_holds"] = all(b is None or d <= b for d, b in bounds)
        out |= {"grants": decisions.count("grant"), "denials": decisions.count("deny")}
        out |= {"n_batches": len(self.batches), "final_version": self.version}
        out["mean_lag"] = sum(lags) / len(lags) if lags else None
        return out | {"max_lag": max(lags) if lags else None}


def _with_in_flight(timeline, permissions, arrivals, threshold) -> list[dict]:
    """Строки шкалы с in_flight_tokens(s) (разрешены до s, пришли не раньше s) и границей:
    событие k поднимает глубину до ≥ T (D_{k−1} < T) → глубина ≤ bound = D_{k−1} + in_flight(k)
    (crossing_in_flight_tokens = in_flight(k)), пока глубина ≥ T; ниже порога оба поля None."""
    arrived_at = {(a["generator"], a["request_id"]): (a["seq"], a["tokens"]) for a in arrivals}
    grants = [
        (p["seq"], *arrived_at.get((p["generator"], p["request_id"]), (math.inf, 0)))
        for p in permissions
        if p["decision"] == "grant"
    ]
    rows, prev_depth, crossing, bound = [], 0, None, None
    for row in timeline:
        flying = [tok for g_seq, a_seq, tok in grants if g_seq < row["seq"] <= a_seq]
        depth = row["depth_tokens"]
        if depth < threshold:
            crossing, bound = None, None
        elif prev_depth < threshold:
            crossing, bound = sum(flying), prev_depth + sum(flying)
        flight = {"in_flight_tokens": sum(flying), "in_flight_requests": len(flying)}
        rows.append(row | flight | {"crossing_in_flight_tokens": crossing, "bound_tokens": bound})
        prev_depth = depth
    return rows


# ----------------------------------------------------------------------------- таблицы урока 12.3


def _queue_results(launch_result: Any) -> tuple[dict, list[dict]]:
    """(результат тренера, [результаты генераторов по рангам]) запуска queue_generators_trainer."""
    ranks = transport.rank_results(launch_result, QUEUE_EXPERIMENT)
    (trainer,) = [r for r in ranks if r["role"] == ROLE_TRAINER]
    return trainer, [r for r in ranks if r["role"] == ROLE_GENERATOR]


def queue_timeline_frame(launch_result: Any):
    """Глубина очереди (pandas.DataFrame), строка на изменение: seq, time_s (с от общей точки
    отсчёта), event, depth_* после события, поля ``_with_in_flight``, threshold_tokens."""
    import pandas as pd

    trainer, _ = _queue_results(launch_result)
    frame = pd.DataFrame(trainer["timeline"]).assign(threshold_tokens=trainer["threshold_tokens"])
    return frame.astype({"crossing_in_flight_tokens": "Float64", "bound_tokens": "Float64"})


def queue_requests_frame(launch_result: Any):
    """Разрешённые запросы генераторов (pandas.DataFrame) по granted_s; времена *_s — с от общей
    точки отсчёта, denials — отказов до разрешения."""
    import pandas as pd

    _, generators = _queue_results(launch_result)
    frame = pd.DataFrame(
        [{"worker": g["worker"], "rank": g["rank"], **r} for g in generators for r in g["requests"]]
    )
    if frame.empty:
        return frame
    return frame.sort_values(["granted_s", "rank"], kind="stable").reset_index(drop=True)


# Ключ сводки → (подпись, единица, знаков после запятой; None — целое); порядок строк текста.
QUEUE_SUMMARY_RU = {
    r["key"]: (r["label"], r["unit"], int(r["digits"]) if r["digits"] else None)
    for _, r in read_exact_csv(
        DATA_DIR / "queue_summary_labels.csv", ("key", "label", "unit", "digits"), "сводка очереди"
    )
}


def queue_summary(launch_result: Any) -> dict:
    """Сводка запуска (ключи ``QUEUE_SUMMARY_RU``). Окно W = конец последнего шага − старт, с;
    токенов/с: λ = пришедшие / W = съеденные / W (μ · busy_fraction) + оставшиеся / W; ρ =
    λ_предл / μ (> 1 — без обратного давления очередь росла бы без предела).
    generator_blocked_share = Σ ожиданий после отказов / (генераторов × duration_s)."""
    trainer, generators = _queue_results(launch_result)
    window = float(trainer["end_s"] - trainer["start_s"])
    accepting = float(trainer["stop_s"] - trainer["start_s"])
    blocked = float(sum(g["backpressure_wait_s"] for g in generators))
    out = {k: trainer[k] for k in QUEUE_SUMMARY_RU if k in trainer}
    out["consumed_tokens_per_s"] = trainer["tokens_consumed"] / window if window > 0 else 0.0
    out["accumulated_tokens_per_s"] = (
        trainer["left_in_queue_tokens"] / window if window > 0 else 0.0
    )
    out.update(window_s=window, duration_s=accepting, generator_blocked_s=blocked)
    share = blocked / (len(generators) * accepting) if accepting > 0 else 0.0
    out.update(generator_blocked_share=share, overshoot_bound_holds=bool(trainer["bound_holds"]))
    return {k: out[k] for k in QUEUE_SUMMARY_RU}


def queue_summary_text(summary: Mapping) -> str:
    """Сводка ``queue_summary`` по-русски: строка «подпись, единица: значение» на величину."""
    from course_utils.fmt import num

    lines = []
    for key, (label, unit, digits) in QUEUE_SUMMARY_RU.items():
        value = summary.get(key)
        if value is None:
            shown = "—"
        elif isinstance(value, bool):
            shown = "да" if value else "нет"
        else:
            shown = num(round(value)) if digits is None else num(float(value), digits)
        lines.append(f"{label}{', ' + unit if unit else ''}: {shown}")
    return "\n".join(lines)
