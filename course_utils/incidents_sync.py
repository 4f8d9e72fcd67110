"""Урок 12.4: два публичных инцидента синхронизации весов на движке курса ``InProcessEngine``.

``sleep_wake_run`` — TRL #5312: после сна движок перечитывает исходные веса с диска, а метка версии
«новая»; проба нулевой задержки ловит это по разрыву log p движка и тренера (порог —
``tim_alarm_threshold``). ``run_pause_mode`` — запросы в полёте при публикации в режимах
abort, wait, keep; ``in_flight_check`` ловит miles #2372 (прерваны обещанные запросы).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from course_utils import policy
from course_utils.args import choice, flag, integer, nonnegative, positive
from course_utils.contract import RolloutRecord, validate_rollout
from course_utils.offpolicy import tim_report
from course_utils.weight_sync import InProcessEngine, probe_input, publish

VARIANTS = {
    "healthy": "без сна: каждую версию движок получает публикацией",
    "broken": "сон уровня 2, пробуждение перечитывает исходные веса с диска (TRL до PR #5313)",
    "fixed": "сон уровня 2, веса возвращает синхронизация с тренером (TRL PR #5313)",
}

PAUSE_MODES = {
    "abort": "запросы в полёте прерываются, их токены выброшены, запросы встают в очередь заново",
    "wait": "публикация ждёт, пока запросы в полёте допишут ответ старыми весами",
    "keep": "запросы заморожены на время публикации и дописывают ответ новыми весами",
}


# ----------------------------------------------------------------------------- устаревшие веса


def tim_alarm_threshold(healthy_gaps, factor: float = 10.0) -> float:
    """Порог пробы нулевой задержки: τ = factor · max_j g_j, нат, где g_j — mean |Δ log p| проб
    здорового запуска того же стека; factor = 10 — запас на разброс между пробами и пакетами."""
    if isinstance(healthy_gaps, str) or not list(healthy_gaps):
        raise ValueError("healthy_gaps должно быть непустым списком mean |Δ| здоровых проб, нат")
    gaps = [nonnegative("healthy_gaps[j]", g) for g in healthy_gaps]
    return positive("factor", factor) * max(gaps)  # нат


def _zero_lag_probe(engine_logprobs, trainer_logprobs, threshold: float | None = None) -> dict:
    """Проба нулевой задержки: g = mean_t |log π_тренер(y_t) − log μ_движок(y_t)|, нат, на версии,
    текущей для тренера (TRL: sampling_logp_difference/mean); fired — g > τ (без порога False)."""
    threshold = None if threshold is None else nonnegative("threshold", threshold)
    rep = tim_report(engine_logprobs, trainer_logprobs)
    gap = rep["abs_delta_mean"]  # нат
    fired = threshold is not None and gap > threshold
    message = f"проба нулевой задержки: mean |Δ log p| = {gap:.3g} нат"
    if threshold is not None:
        verdict = "движок обслуживает не те веса, что заявляет версия" if fired else "согласованы"
        message += f" {'>' if fired else '≤'} порога {threshold:.3g} нат — {verdict}"
    probe = {"gap": gap, "max_gap": rep["abs_delta_max"], "threshold": threshold, "fired": fired}
    return probe | {"message": message}


def sleep_wake_run(
    model, tokenizer, tasks, variant="fixed", steps=3, lr=3e-5, seed=0, threshold=None, **generate
) -> list[dict]:
    """GRPO с ``InProcessEngine`` (``VARIANTS``), шаг k: генерация (версия k) → log π тренера →
    проба → сон (кроме healthy) → шаг GRPO → ``publish`` версии k + 1 → пробуждение (broken
    перечитывает model). Строка на шаг: step, версии, weights_match (SHA-256) и ключи пробы."""
    choice("variant", variant, VARIANTS)
    steps = integer("steps", steps, 1)
    engine, trainer = InProcessEngine(model), copy.deepcopy(model).float()
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=positive("lr", lr))
    rows = []
    for k in range(steps + 1):
        options = {"policy_version": engine.version, "seed": seed + k} | generate
        served = engine.serve(
            lambda m, _, o=options: policy.generate_rollouts(m, tokenizer, tasks, **o)
        )
        records = served.output.records
        behaviour = [torch.tensor(r.behavior_logprobs) for r in records]
        target = [t.cpu() for t in policy.recompute_logprobs(trainer, records)]
        same = engine.checksum() == engine.expected_checksum(trainer)
        row = {"step": k, "engine_version": engine.version, "trainer_version": k}
        rows.append(row | {"weights_match": same} | _zero_lag_probe(behaviour, target, threshold))
        if k == steps:
            return rows
        if variant != "healthy":
            engine.sleep()  # после генерации: веса выброшены
        policy.grpo_step(trainer, optimizer, records)
        publish(engine, trainer, k + 1)  # sync_weights: тренер → движок, версия k + 1
        if variant != "healthy":  # generate(): wake_up + reload_weights — исходные веса с диска
            engine.wake(model if variant == "broken" else None)


# ----------------------------------------------------------------------------- режимы паузы


@dataclass
class _PauseRun:
    """Прогон режима паузы: записи контракта (версия у каждого токена) и цена публикации."""

    mode: str
    abort_all_requests: bool  # публикация сама прерывает всё в полёте, вопреки режиму
    version: int  # опубликованная версия; до неё движок обслуживал version − 1
    records: list[RolloutRecord]
    in_flight: int  # запросов в полёте, когда публикация запрошена
    aborted: int  # из них прервано
    wasted_tokens: int  # декодированных и выброшенных токенов
    delay_ticks: int  # тактов декодирования от запроса публикации до переключения
    delay_s: float  # то же в секундах, вместе с самой публикацией
    ticks: int  # тактов до конца всех ответов

    @property
    def aborted_fraction(self) -> float:
        """Доля прерванных среди запросов в полёте: aborted / in_flight."""
        return self.aborted / self.in_flight if self.in_flight else 0.0

    def row(self) -> dict:
        """Строка таблицы для показа (русские заголовки, единицы в названиях)."""
        versions = [set(r.token_policy_versions) for r in self.records]
        decoded = sum(len(r.response_tokens) for r in self.records) + self.wasted_tokens
        mode = self.mode + (" + abort_all_requests" if self.abort_all_requests else "")
        return {
            "режим": mode,
            "в полёте при публикации, запросов": self.in_flight,
            "прервано, доля": self.aborted_fraction,
            "выброшено, токенов": self.wasted_tokens,
            "декодировано всего, токенов": decoded,
            "задержка публикации, тактов": self.delay_ticks,
            "задержка публикации, мс": 1e3 * self.delay_s,
            "ответов старой версии": sum(v == {self.version - 1} for v in versions),
            "ответов со смесью версий": sum(len(v) > 1 for v in versions),
            "тактов до конца": self.ticks,
        }


@torch.no_grad()
def run_pause_mode(engine, new_state, mode, lengths, publish_at, abort_all_requests=False):
    """Ответы длиной lengths токенов (запрос — 6 случайных токенов) декодируются по токену за
    такт (T = 1, без KV-кэша); на такте publish_at new_state публикуется как версия + 1 в режиме
    mode (``PAUSE_MODES``); abort_all_requests — публикация прерывает всё (SGLang в miles #2372)."""
    if not isinstance(engine, InProcessEngine):
        raise ValueError(f"engine должно быть InProcessEngine, получено {type(engine).__name__}")
    choice("mode", mode, PAUSE_MODES)
    lengths = [integer("lengths[i]", n, 1) for n in lengths]
    n, version = integer("len(lengths)", len(lengths), 1), engine.version + 1
    publish_at = integer("publish_at", publish_at, 1, max(lengths) - 1)
    aborting = mode == "abort" or flag("abort_all_requests", abort_all_requests)
    prompts = [probe_input(engine.vocab_size, 1, 6, seed=i)[0].tolist() for i in range(n)]
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    out: list[list[tuple[int, float, int]]] = [[] for _ in range(n)]  # (токен, log μ, версия)
    active, tick, published, started = set(range(n)), 0, False, None
    aborted = wasted = 0  # без прерывания
    while active or not published:
        if tick == publish_at:  # публикацию запросили: сколько запросов в полёте
            started, in_flight = time.perf_counter(), len(active)
        if started is not None and not published and (mode != "wait" or not active):
            if aborting:  # прерванные встают в очередь заново и начнут ответ с нуля
                aborted, wasted = len(active), sum(len(out[i]) for i in active)
                out = [[] if i in active else o for i, o in enumerate(out)]
            publish(engine, new_state, version)  # в паузе между тактами: ни один forward не идёт
            published, delay, delay_s = True, tick - publish_at, time.perf_counter() - started
        batches: dict[int, list[int]] = {}  # равной длины — один forward на пакет (без паддинга)
        for i in sorted(active):
            batches.setdefault(len(out[i]), []).append(i)
        for batch in batches.values():
            ids = torch.tensor([prompts[i] + [t for t, _, _ in out[i]] for i in batch])
            res = engine.forward(ids)
            logp = policy.sampling_logprobs(res.logits[:, -1])  # [пакет, словарь], нат
            for row, i in enumerate(batch):
                token = int(torch.multinomial(logp[row].exp(), 1, generator=gens[i]))
                out[i].append((token, float(logp[row, token]), res.version))
                if len(out[i]) == lengths[i]:
                    active.discard(i)
        tick += 1
    records = [_rollout_record(f"{mode}-req-{i}", prompts[i], out[i]) for i in range(n)]
    forced = aborting and mode != "abort"
    return _PauseRun(
        mode, forced, version, records, in_flight, aborted, wasted, delay, delay_s, tick - 1
    )


def _rollout_record(sample_id: str, prompt: list[int], out: list[tuple]) -> RolloutRecord:
    tokens, logps, versions = (list(x) for x in zip(*out))
    return RolloutRecord(
        sample_id=sample_id,
        policy_version=versions[0] if len(set(versions)) == 1 else None,
        prompt_tokens=prompt,
        response_tokens=tokens,
        policy_mask=[0] * len(prompt) + [1] * len(tokens),
        behavior_logprobs=logps,
        decoding={"temperature": 1.0, "top_p": 1.0},
        reward={"reward": 0.0},
        stop_reason="length",
        verifier_version="нет: опыт без задачи",
        token_policy_versions=versions,
    )


def in_flight_check(run: _PauseRun) -> dict:
    """fired, если режим ≠ abort, а публикация прервала запросы (miles #2372), или записи нарушают
    контракт (``validate_rollout``); ключи fired, violations, message."""
    violations = [m for r in run.records for m in validate_rollout(r)]
    lost = run.mode != "abort" and run.aborted > 0
    if lost:
        message = (
            f"режим {run.mode} обещал сохранить запросы в полёте, а публикация прервала "
            f"{run.aborted} из {run.in_flight}: выброшено {run.wasted_tokens} токенов"
        )
    else:
        message = f"режим {run.mode}: публикация не нарушила обещание режима"
    if violations:
        message += f"; нарушений контракта: {len(violations)} ({violations[0]})"
    return {"fired": lost or bool(violations), "violations": violations, "message": message}
