"""Урок 12.1, уровень C: синхронный цикл генератор → тренер в двух процессах."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from course_utils.args import (
    flag,
    integer,
    positive,
    text,
)
from course_utils.multiproc.transport import (
    CLOCK_NOTE,
    GENERATOR_RANK,
    ROLE_GENERATOR,
    ROLE_TRAINER,
    TRAINER_RANK,
    _Stages,
    rank_results,
    recv_object,
    recv_tensors,
    send_object,
    send_tensors,
    shared_time_ref,
    state_checksum,
)

# ----------------------------------------------------------------------------- урок 12.1

SYNC_EXPERIMENT = "sync_generator_trainer"


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
        "experiment": SYNC_EXPERIMENT,
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


# ----------------------------------------------------------------------------- таблицы для ноутбука


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

    by_role = {r["role"]: r for r in rank_results(launch_result, SYNC_EXPERIMENT)}
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
