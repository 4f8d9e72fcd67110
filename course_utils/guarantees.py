"""Семь гарантий RL-контура (шаг 12.5.5) и предполётная проверка описания запуска.

``preflight(run)`` для каждой гарантии говорит, выполнена ли она по описанию запуска (заявлениям
команды, не измерениям) и чего не хватает; подтверждают их тесты и аварии уроков 12.1–12.5.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from course_utils.args import choice
from course_utils.checkpoint import COMPONENTS as _COMPONENTS
from course_utils.tracing import TRACE_CHAIN

_RECORD_FIELDS = ("tokens", "policy_mask", "behavior_logprobs", "reward", "stop_reason", "versions")
_SYNC_PROPERTIES = ("version_id", "atomic_switch", "readiness_barrier", "verification")
_RUN_KEYS = frozenset(
    "name decoding_logged weights_can_change_mid_response per_token_versions record_fields "
    "asynchronous queue_limit variable_lengths max_policy_lag logs_ratio_diagnostics "
    "off_policy_correction sync checkpoint_components crash_tested trace_ids".split()
)

# ключ гарантии → формулировка для таблицы preflight
_RU = {
    "behavior_policy": "1. Политика поведения: известны версия весов и правила декодирования каждого токена",
    "rollout_contract": "2. Роллаут хранит токены, маску, log-вероятности, награду, причину остановки, версии",
    "bounded_queue": "3. Очередь ограничивает возраст и объём данных (в токенах, не в записях)",
    "declared_update": "4. Обновление — относительно объявленной политики поведения, отношения под контролем",
    "atomic_sync": "5. Синхронизация атомарно публикует новую версию",
    "full_checkpoint": "6. Контрольная точка позволяет продолжить тот же эксперимент (проверено аварией)",
    "trace_chain": "7. Трассировка связывает ответ с шагом оптимизатора и обратно",
}
GUARANTEES = tuple(_RU.items())

PREFLIGHT_ORDER = (
    "последовательный эталон на одном процессе",
    "контракт роллаута и нулевая задержка",
    "память по компонентам и фазам",
    "критический путь и хвосты длительности",
    "перекрытие, и только затем асинхронность",
    "задержка, TIM, ESS и доля клиппирования в журнале",
    "восстановление, проверенное принудительным сбоем",
    "сравнение стеков на одной задаче и в одних единицах стоимости",
)


def _check(run: Mapping) -> dict[str, list[str]]:
    """Пробелы по ключу гарантии: пустой список — гарантия выполнена."""

    def missing(key: str, required: tuple, text: str) -> list[str]:
        have = set(run.get(key) or ())
        return [text.format(x) for x in required if x not in have]

    out = {key: [] for key in _RU}
    if not run.get("decoding_logged"):
        out["behavior_policy"].append("правила декодирования (температура, top-p) не записываются")
    if run.get("weights_can_change_mid_response") and not run.get("per_token_versions"):
        out["behavior_policy"].append("веса меняются посреди ответа, а версий по токенам нет")
    out["rollout_contract"] = missing("record_fields", _RECORD_FIELDS, "в записи нет поля {}")
    if run.get("asynchronous"):
        queue = out["bounded_queue"]
        if run.get("queue_limit") is None:
            queue.append("асинхронная очередь без порога")
        elif run.get("queue_limit") == "rollouts" and run.get("variable_lengths", True):
            queue.append("порог в записях при разной длине ответов — нужен порог в токенах")
        if run.get("max_policy_lag") is None:
            queue.append("нет ограничения задержки политики")
    if not run.get("logs_ratio_diagnostics"):
        out["declared_update"].append("ESS, доля клиппирования и |log w| не записываются")
    if run.get("asynchronous") and not run.get("off_policy_correction"):
        out["declared_update"].append("асинхронные данные без поправки, отбрасывания или пересчёта")
    out["atomic_sync"] = missing("sync", _SYNC_PROPERTIES, "нет свойства синхронизации: {}")
    ckpt = missing("checkpoint_components", _COMPONENTS, "контрольная точка не хранит {}")
    if not run.get("crash_tested"):
        ckpt.append("восстановление не проверено принудительным сбоем")
    out["full_checkpoint"] = ckpt
    out["trace_chain"] = missing("trace_ids", TRACE_CHAIN, "в трассе нет {}")
    return out


def preflight(run: Mapping) -> pd.DataFrame:
    """Предполётная проверка: строка на гарантию — выполнена ли и чего не хватает (по-русски).

    ``run`` — словарь с ключами из ``_RUN_KEYS`` (queue_limit: "tokens", "rollouts" или None;
    sync — из _SYNC_PROPERTIES, checkpoint_components — из checkpoint.COMPONENTS, trace_ids — из
    TRACE_CHAIN). Отсутствующий ключ = «не заявлено».
    """
    if not isinstance(run, Mapping):
        raise ValueError(f"run должен быть словарём-описанием, получено {type(run).__name__}")
    if unknown := sorted(set(run) - _RUN_KEYS):
        raise ValueError(f"run: неизвестные ключи {unknown}; допустимы {sorted(_RUN_KEYS)}")
    choice("run['queue_limit']", run.get("queue_limit"), (None, "tokens", "rollouts"))
    gaps = _check(run)
    return pd.DataFrame(
        [
            {"гарантия": text, "выполнена": not gaps[key], "чего не хватает": "; ".join(gaps[key])}
            for key, text in GUARANTEES
        ]
    )


def example_runs() -> dict[str, dict]:
    """Два описания для ноутбука: эталон курса (всё на месте) и «быстрый прототип» с дырами."""
    full = {
        "name": "эталон курса",
        "decoding_logged": True,
        "per_token_versions": True,
        "weights_can_change_mid_response": False,
        "record_fields": list(_RECORD_FIELDS),
        "asynchronous": True,
        "queue_limit": "tokens",
        "max_policy_lag": 2,
        "logs_ratio_diagnostics": True,
        "off_policy_correction": True,
        "sync": list(_SYNC_PROPERTIES),
        "checkpoint_components": list(_COMPONENTS),
        "crash_tested": True,
        "trace_ids": list(TRACE_CHAIN),
    }
    quick = {
        "name": "быстрый прототип",
        "decoding_logged": False,
        "weights_can_change_mid_response": True,
        "record_fields": ["tokens", "reward"],
        "asynchronous": True,
        "queue_limit": "rollouts",
        "logs_ratio_diagnostics": False,
        "sync": ["version_id"],
        "checkpoint_components": ["policy", "optimizer"],
        "crash_tested": False,
        "trace_ids": ["prompt_id", "rollout_id"],
    }
    return {"full": full, "quick": quick}
