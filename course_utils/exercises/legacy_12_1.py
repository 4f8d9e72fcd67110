"""Проверочные шаги урока 12.1: контракт роллаута (12.1.6) и профиль цикла с картой осей (12.1.7).

Модуль регистрирует оба упражнения при импорте. Условия и данные детерминированы по номеру
варианта; верные ответы считают ``contract.violated_rules`` и функции ``course_utils.profile``.
Клетки карты 12.1.7 — из словаря осей ``stack_map`` (тот же, что у карты и проверки CSV).
torch здесь не импортируется.

Типичная ошибка (Misconception) узнаётся не только в «канонической» форме: ``_Family`` — это
канонический неверный ответ (обычный словарь) с правилом, которое узнаёт всё семейство ответов с той
же ошибкой; сравнение ``_compare`` применяет это правило, если верного совпадения нет.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

from course_utils import contract, profile, stack_map
from course_utils.exercises.common import (
    Family as _Family,
    family_compare as _compare,
    norm as _norm,
    norm_dict as _norm_dict,
)
from course_utils.grading import Exercise, Misconception, answers_match, register

# ---------------------------------------------------------------- общее


def _md_code(x: Any) -> str:
    return f"`{x}`"


# ================================================================ 12.1.6 — контракт роллаута
_BREAKABLE = (
    "mask_length",
    "logprob_count",
    "logprob_positive",
    "decoding",
    "policy_version",
    "missing_field",
)
_ALWAYS_BROKEN = ("mask_prompt", "mixed_versions")


def _single_turn(rng: random.Random, sid: str, version: int | None) -> dict:
    """Пригодная однократная запись: запрос, ответ с EOS, маска 0…0 1…1, логарифмы < 0."""
    n_prompt, n_resp = rng.randint(3, 6), rng.randint(3, 6)
    run, prompt_id, _ = sid.split("-")
    record = contract.RolloutRecord(
        sample_id=sid,
        policy_version=version,
        prompt_tokens=[rng.randint(10, 999) for _ in range(n_prompt)],
        response_tokens=[rng.randint(10, 999) for _ in range(n_resp - 1)] + [2],
        policy_mask=[0] * n_prompt + [1] * n_resp,
        behavior_logprobs=[round(-rng.uniform(0.01, 2.5), 2) for _ in range(n_resp)],
        decoding={"temperature": rng.choice([0.7, 0.8, 1.0]), "top_p": rng.choice([1.0, 0.95])},
        reward={"correctness": float(rng.randint(0, 1)), "format": 1.0},
        stop_reason="eos",
        verifier_version="arith-v4",
        trace_id=f"{sid}-v{version}",
        prompt_id=prompt_id,
        group_id=f"{run}-{prompt_id}",
    )
    return record.to_dict()


def _multiturn(sid: str, version: int) -> dict:
    """Ловушка (пригодна): двухходовая запись, токены инструмента внутри ответа с маской 0."""
    run, prompt_id, _ = sid.split("-")
    rec = contract.example_multiturn_record().to_dict()
    rec.update(sample_id=sid, policy_version=version, trace_id=f"{sid}-v{version}")
    rec.update(prompt_id=prompt_id, group_id=f"{run}-{prompt_id}")
    return rec


def _switch_versions(rng: random.Random, n: int, version: int) -> list[int]:
    """Поточечные версии: первые k токенов выбраны версией v − 1, остальные — версией v."""
    k = rng.randint(1, n - 1)
    return [version - 1] * k + [version] * (n - k)


def _break(rng: random.Random, rec: dict, rule: str, version: int) -> dict:
    """Портит пригодную однократную запись так, чтобы нарушилось ровно правило ``rule``."""
    n_prompt, n_resp = len(rec["prompt_tokens"]), len(rec["response_tokens"])
    if rule == "mask_prompt":  # маска сдвинута на токен влево: последний токен запроса = 1
        rec["policy_mask"][n_prompt - 1] = 1
        rec["behavior_logprobs"].insert(0, round(-rng.uniform(0.5, 3.0), 2))
    elif rule == "mask_length":  # лишний ноль в конце маски
        rec["policy_mask"].append(0)
    elif rule == "logprob_count":  # потерян логарифм вероятности EOS
        rec["behavior_logprobs"].pop()
    elif rule == "logprob_positive":  # записали вероятности вместо их логарифмов
        rec["behavior_logprobs"] = [round(math.exp(x), 2) for x in rec["behavior_logprobs"]]
    elif rule == "mixed_versions":  # веса сменились посреди ответа, а метка одна
        rec["token_policy_versions"] = _switch_versions(rng, n_resp, version)
    elif rule == "decoding":  # настройки декодирования записаны не полностью или неверно
        temperature = rec["decoding"]["temperature"]
        rec["decoding"] = rng.choice(
            [{"temperature": temperature}, {"temperature": temperature, "top_p": 0.0}]
        )
    elif rule == "policy_version":  # версию не записали, поточечных версий нет
        rec["policy_version"] = None
    elif rule == "missing_field":  # потеряно поле при сериализации
        del rec[rng.choice(["verifier_version", "stop_reason"])]
    else:  # pragma: no cover — защита от опечатки в таблице правил
        raise ValueError(f"неизвестное правило {rule!r}")
    return rec


def _rules_list() -> str:
    return "\n".join(f"- `{key}` — {text}" for key, text in contract.RULES.items())


def _task_12_1_6(variant: int) -> dict:
    rng = random.Random(12_1_6_000 + 7919 * variant)
    n_total = rng.randint(8, 10)
    extra = rng.sample(_BREAKABLE, rng.randint(1, 2))
    broken_rules = [*_ALWAYS_BROKEN, *extra]
    run = f"run{rng.randint(10, 99)}"
    prompt_ids = rng.sample(range(1, 200), n_total)
    sids = [f"{run}-p{p:03d}-g{rng.randint(0, 7):02d}" for p in prompt_ids]
    version = rng.randint(100, 400)
    records = []
    for sid, rule in zip(sids, broken_rules):
        rec = _break(rng, _single_turn(rng, sid, version), rule, version)
        assert contract.violated_rules(rec) == [rule], (rule, contract.violated_rules(rec))
        records.append(rec)
    rest = sids[len(broken_rules) :]
    records.append(_multiturn(rest[0], version))
    per_token = _single_turn(rng, rest[1], None)
    per_token["token_policy_versions"] = _switch_versions(
        rng, len(per_token["response_tokens"]), version
    )
    per_token["trace_id"] = f"{rest[1]}-v{version - 1}-{version}"
    records.append(per_token)
    records += [_single_turn(rng, sid, version) for sid in rest[2:]]
    for rec in records[len(broken_rules) :]:
        assert contract.violated_rules(rec) == [], (
            rec["sample_id"],
            contract.validate_rollout(rec),
        )
    rng.shuffle(records)
    statement = (
        f"**Контракт роллаута.** В `task['records']` — пакет из {n_total} записей роллаутов "
        "(обычные словари с полями шага 12.1.2; удобно посмотреть таблицей: "
        "`contract.records_to_frame(task['records'])`). Часть записей непригодна для честного "
        "обновления политики, и в каждой такой записи нарушено ровно одно правило контракта. "
        "Остальные записи пригодны — в том числе те, что выглядят непривычно.\n\n"
        "Найдите непригодные записи и для каждой назовите нарушенное правило. Ответ — словарь "
        "`{sample_id: ключ_правила}` только для непригодных записей, например "
        f'`{{"{run}-p000-g00": "decoding"}}`. Ключи правил (они же в `task["rules"]`):\n\n'
        f"{_rules_list()}\n\n"
        "Ищите сами, не вызывая `contract.validate_rollout`: в этом смысл шага. "
        "После проверки можно сверить с ним."
    )
    return {"statement": statement, "records": records, "rules": dict(contract.RULES)}


def _reference_12_1_6(task: dict) -> dict:
    out = {}
    for rec in task["records"]:
        rules = contract.violated_rules(rec)
        if rules:
            out[rec["sample_id"]] = rules[0]
    return out


def _sid_with_rule(task: dict, rule: str) -> str:
    return next(sid for sid, r in _reference_12_1_6(task).items() if r == rule)


def _multiturn_sid(task: dict) -> str:
    """Пригодная запись с нулями маски внутри ответа (токены среды)."""
    for rec in task["records"]:
        resp_mask = rec["policy_mask"][len(rec["prompt_tokens"]) :]
        if not contract.violated_rules(rec) and 0 in resp_mask:
            return rec["sample_id"]
    raise ValueError("в пакете нет многоходовой записи")


def _per_token_sid(task: dict) -> str:
    """Пригодная запись с policy_version=None и поточечными версиями."""
    for rec in task["records"]:
        if not contract.violated_rules(rec) and rec.get("token_policy_versions"):
            return rec["sample_id"]
    raise ValueError("в пакете нет записи с поточечными версиями")


def _given_rules(given: Any) -> dict | None:
    d = _norm_dict(given)
    if d is None or not all(isinstance(v, str) for v in d.values()):
        return None
    return {k: _norm(v) for k, v in d.items()}


def _mc_env_tokens(task: dict) -> _Family:
    ref, trap = _reference_12_1_6(task), _multiturn_sid(task)

    def accepts(given: Any) -> bool:
        g = _given_rules(given)
        if g is None or _norm(trap) not in g:
            return False
        rest = {k: v for k, v in g.items() if k != _norm(trap)}
        return rest == {_norm(k): _norm(v) for k, v in ref.items()}

    return _Family({**ref, trap: "logprob_count"}, accepts)


def _mc_single_version(task: dict) -> _Family:
    ref = _reference_12_1_6(task)
    mixed, trap = _sid_with_rule(task, "mixed_versions"), _per_token_sid(task)
    norm_ref = {_norm(k): _norm(v) for k, v in ref.items()}

    def accepts(given: Any) -> bool:
        g = _given_rules(given)
        if g is None or g == norm_ref:
            return False
        rest = {k: v for k, v in g.items() if k != _norm(trap)}
        without_mixed = {k: v for k, v in norm_ref.items() if k != _norm(mixed)}
        return rest in (norm_ref, without_mixed)

    return _Family({k: v for k, v in ref.items() if k != mixed}, accepts)


def _validate_12_1_6(answer: Any, task: dict) -> str | None:
    if not isinstance(answer, Mapping):
        return (
            "Ожидается словарь {sample_id: ключ_правила} для непригодных записей; "
            f"получено: {type(answer).__name__}."
        )
    known = {_norm(rec["sample_id"]) for rec in task["records"]}
    rules = {_norm(k) for k in contract.RULES}
    for key, value in answer.items():
        if not isinstance(key, str) or _norm(key) not in known:
            return f"Записи {key!r} нет в пакете: ключи ответа — sample_id из task['records']."
        if not isinstance(value, str) or _norm(value) not in rules:
            return (
                f"Правило {value!r} для {key} неизвестно: значения — ключи contract.RULES "
                f"({', '.join(contract.RULES)})."
            )
    return None


def _why_valid(rec: dict) -> str:
    resp_mask = rec["policy_mask"][len(rec["prompt_tokens"]) :]
    if 0 in resp_mask:
        n_env = resp_mask.count(0)
        return (
            f"пригодна: нули маски внутри ответа ({n_env} шт.) — токены среды (ответ "
            "инструмента), политика их не выбирала; логарифмов "
            f"{len(rec['behavior_logprobs'])} — ровно столько, сколько единиц в маске"
        )
    if rec.get("policy_version") is None:
        versions = sorted(set(rec["token_policy_versions"]))
        return (
            f"пригодна: policy_version = None, а версии {versions} записаны по токену — "
            "это честный способ описать смену весов посреди ответа (шаг 12.1.4)"
        )
    return "пригодна"


def _solution_12_1_6(task: dict) -> str:
    ref = _reference_12_1_6(task)
    rows = ["| sample_id | вердикт | почему |", "|---|---|---|"]
    for rec in task["records"]:
        sid = rec["sample_id"]
        if sid in ref:
            why = contract.validate_rollout(rec)[0].split("] ", 1)[1]
            rows.append(f"| `{sid}` | `{ref[sid]}` | {why} |")
        else:
            rows.append(f"| `{sid}` | — | {_why_valid(rec)} |")
    answer = ", ".join(f'"{k}": "{v}"' for k, v in ref.items())
    return (
        "Идём по записям и проверяем правила по порядку: все ли поля на месте; длина маски "
        "равна len(prompt_tokens) + len(response_tokens); на позициях запроса маска 0; число "
        "единиц маски равно числу логарифмов вероятностей; все логарифмы ≤ 0; версия — одно "
        "целое, если весь ответ выбран одной версией, иначе None и поточечные версии; "
        "temperature > 0 и top_p из (0, 1].\n\n"
        + "\n".join(rows)
        + f"\n\n**Ответ:** `{{{answer}}}`.\n\n"
        "Ловушки: нули маски внутри ответа многоходовой записи — не ошибка, а требование "
        "контракта (токены среды не обучаются); запись с `policy_version = None` и поточечными "
        "версиями пригодна, а одна целая метка на ответ, выбранный двумя версиями, — нет."
    )


def _mismatch_12_1_6(expected: dict, answer: dict, task: dict) -> str:
    """Отзыв без раскрытия номеров записей: сколько найдено, сколько лишних, сколько правил неверно."""
    exp = {str(k).strip(): str(v).strip() for k, v in expected.items()}
    got = {str(k).strip(): str(v).strip() for k, v in answer.items()}
    found = exp.keys() & got.keys()
    wrong_rule = sum(exp[k] != got[k] for k in found)
    return (
        f"Непригодных записей в пакете: {len(exp)}. Вы верно отметили {len(found)} из них, "
        f"у {wrong_rule} правило названо неверно; лишних (на самом деле пригодных) записей "
        f"в ответе: {len(got.keys() - exp.keys())}."
    )


register(
    Exercise(
        id="12.1.6",
        title="Контракт роллаута: непригодные записи и нарушенное правило",
        make_task=_task_12_1_6,
        reference=_reference_12_1_6,
        solution=_solution_12_1_6,
        hint=(
            "Для каждой записи сравните три длины: маски, запроса + ответа и списка логарифмов "
            "(он равен числу единиц маски, а не длине ответа). Затем посмотрите на позиции "
            "запроса в маске, на знаки логарифмов, на версии и на decoding. Нули маски внутри "
            "ответа — это токены среды, а policy_version = None допустим, если есть поточечные "
            "версии."
        ),
        misconceptions=[
            Misconception(
                "prompt_in_mask",
                "Пропущена запись, где маска политики равна 1 на токене запроса. Маска политики "
                "не должна покрывать токены запроса: их не выбирала политика, и градиент по ним "
                "учил бы модель «писать» условие задачи. Это нарушение `mask_prompt`.",
                lambda t: {
                    k: v
                    for k, v in _reference_12_1_6(t).items()
                    if k != _sid_with_rule(t, "mask_prompt")
                },
            ),
            Misconception(
                "env_tokens_flagged",
                "Вы отметили многоходовую запись, а она пригодна. Нули маски внутри ответа — "
                "токены среды или инструмента: политика их не выбирала, поэтому маска 0 и для них "
                "нет логарифмов вероятностей. Логарифмов столько, сколько единиц в маске, а не "
                "сколько токенов в ответе.",
                _mc_env_tokens,
            ),
            Misconception(
                "single_version_ok",
                "Ошибка с версиями политики. Одна целая метка policy_version на ответ, токены "
                "которого выбраны разными версиями (token_policy_versions различаются), — "
                "нарушение `mixed_versions` (шаг 12.1.4). А запись с policy_version = None и "
                "поточечными версиями, наоборот, пригодна: так честно описывают смену весов "
                "посреди ответа.",
                _mc_single_version,
            ),
        ],
        compare=_compare,
        validate_answer=_validate_12_1_6,
        describe_mismatch=_mismatch_12_1_6,
    )
)


# ================================================================ 12.1.7 — профиль и две оси
# Клетки «размещение/синхронность» — из словаря карты: два размещения × два режима лекции.
SETUP_CLASSES = tuple(f"{p}/{s}" for p in stack_map.PLACEMENTS for s in stack_map.SYNCHRONY)

# (описание, клетка, почему) — классификация однозначна в терминах шага 12.1.3.
_SETUPS: tuple[tuple[str, str, str], ...] = (
    (
        "Один GPU: модель генерирует пакет ответов, затем на нём же обучается; следующая "
        "генерация начинается только после шага оптимизатора.",
        "colocated/sync",
        "роли по очереди занимают один GPU, каждый пакет собран текущими весами",
    ),
    (
        "Движок генерации и тренер делят одни и те же 8 GPU: на время генерации состояние "
        "оптимизатора выгружается в память CPU, потом движок освобождает KV-кэш и идёт "
        "обновление; каждый пакет порождён текущей версией весов.",
        "colocated/sync",
        "одни и те же GPU по очереди; данные одной, текущей версии",
    ),
    (
        "Одни и те же 4 GPU попеременно генерируют и обучают, но тренер не ждёт свежих ответов: "
        "он берёт пакет из буфера, где лежат ответы двух-трёх предыдущих версий политики.",
        "colocated/async",
        "размещение совместное, но данные приходят с разными (старыми) версиями — оси независимы",
    ),
    (
        "Генератор — отдельный vLLM-сервер на своих GPU. Тренер отправляет запросы, ждёт весь "
        "пакет, делает шаг и только потом рассылает новые веса; всё это время сервер простаивает.",
        "disaggregated/sync",
        "отдельный сервер, но тренер ждёт каждый пакет текущей версии — "
        "отдельный сервер не делает алгоритм асинхронным",
    ),
    (
        "Два пула на разных узлах: 16 GPU генерации и 16 GPU обучения. Пулы работают строго по "
        "очереди, каждый пакет порождён текущей версией весов.",
        "disaggregated/sync",
        "раздельные пулы, но строгая очередность и одна версия на пакет",
    ),
    (
        "Сборщики на отдельных машинах готовят пакет и блокируются на барьере, пока тренер не "
        "закончит шаг оптимизатора и они не получат новые веса.",
        "disaggregated/sync",
        "раздельные машины, барьер: следующий пакет только после обновления",
    ),
    (
        "Отдельные пулы генерации и обучения связаны очередью; сборщики не останавливаются во "
        "время обновления, данные отстают от тренера не более чем на 2 версии.",
        "disaggregated/async",
        "раздельные пулы, генерация идёт во время обновления, данные разных версий",
    ),
    (
        "Движки SGLang на отдельных узлах генерируют непрерывно и подтягивают веса раз в "
        "несколько шагов; тренер забирает из буфера всё, что пришло, с версией каждого роллаута.",
        "disaggregated/async",
        "раздельные узлы, непрерывная генерация, версии в буфере разные",
    ),
    (
        "Генератор на своих GPU собирает пакет k + 1, пока тренер на других GPU обучается на "
        "пакете k (отставание данных — одна версия).",
        "disaggregated/async",
        "раздельные GPU; генерация перекрыта с обучением, данные отстают на версию — это "
        "«на шаг позади» (one-step-off), частный случай асинхронного режима",
    ),
)

# (множители медиан synthetic_profile, описание запуска)
_SCENARIOS: tuple[tuple[dict[str, float], str], ...] = (
    ({}, "длинные рассуждения, малые группы"),
    ({"reward": 25.0}, "верификатор запускает тесты в песочнице"),
    ({"decode": 0.25, "forward_backward": 2.0}, "короткие ответы, несколько эпох PPO на пакет"),
    ({"decode": 0.3, "weight_sync": 12.0}, "веса передаются по медленной сети"),
)


def _task_12_1_7(variant: int) -> dict:
    rng = random.Random(12_1_7_000 + 7919 * variant)
    scale, scenario = _SCENARIOS[variant % len(_SCENARIOS)]
    seed = (12_170 + 7919 * variant) % 2**32
    medians = profile.stage_medians(profile.synthetic_profile(steps=8, seed=seed, scale=scale))
    times = {stage: round(float(t), 2) for stage, t in medians.items()}
    total = profile.sequential_time(times)
    candidates = [s for s, t in times.items() if t >= 0.1 * total]
    # T_seq/T и T_seq/(T_seq − T) совпадают при T = T_seq/2: такой этап не годится
    candidates = [s for s in candidates if abs(1 - 2 * times[s] / total) > 0.05] or [
        profile.dominant_stage(times)
    ]
    accelerate = rng.choice(candidates)
    by_class = {c: [s for s in _SETUPS if s[1] == c] for c in SETUP_CLASSES}
    chosen = [
        rng.choice(by_class["disaggregated/sync"]),
        rng.choice(by_class["disaggregated/async"]),
    ]
    chosen.append(rng.choice(by_class["colocated/sync"] + by_class["colocated/async"]))
    chosen.append(rng.choice([s for s in _SETUPS if s not in chosen]))
    rng.shuffle(chosen)
    setups = {sid: text for sid, (text, _, _) in zip("ABCD", chosen)}
    table = "\n".join(
        f"| `{s}` | {profile.STAGE_LABELS_RU.get(s, s)} | {t:.2f} |" for s, t in times.items()
    )
    setup_lines = "\n".join(f"- **{sid}.** {text}" for sid, text in setups.items())
    statement = (
        f"**Профиль цикла и две оси.** Запуск: {scenario}. Медианы времён этапов одного шага "
        "последовательного цикла после прогрева (они же в `task['stage_times']`), секунды:\n\n"
        "| этап | что это | время, с |\n|---|---|---|\n"
        f"{table}\n\n"
        "Найдите:\n"
        "1. `T_seq` — длительность последовательного шага, с;\n"
        "2. `dominant` — ключ этапа, который доминирует (например `'decode'`);\n"
        f"3. `speedup_bound` — во сколько раз максимум ускорится шаг, если этап `{accelerate}` "
        f"({profile.STAGE_LABELS_RU[accelerate]}) станет бесплатным (безразмерное число);\n"
        "4. `setups` — клетку карты «размещение × синхронность» для каждой схемы ниже "
        f"(`task['setups']`): одна из строк {', '.join(_md_code(c) for c in SETUP_CLASSES)} "
        f"({_axes_legend()}).\n\n"
        f"{setup_lines}\n\n"
        'Ответ — словарь `{"T_seq": …, "dominant": …, "speedup_bound": …, '
        '"setups": {"A": …, "B": …, "C": …, "D": …}}`. Числа сравниваются с относительным '
        "допуском 1 %."
    )
    return {
        "statement": statement,
        "scenario": scenario,
        "stage_times": times,
        "accelerate": accelerate,
        "setups": setups,
        "setup_classes": list(SETUP_CLASSES),
    }


def _axes_legend() -> str:
    """«colocated — совместное, …»: коды клеток словами, из словаря осей карты."""
    codes = [*stack_map.PLACEMENTS, *stack_map.SYNCHRONY]
    words = ", ".join(f"`{c}` — {stack_map.VALUE_LABELS[c]}" for c in codes)
    return f"{words}; «на шаг позади» — частный случай асинхронного режима"


def _setup_class(text: str) -> tuple[str, str]:
    return next((cls, why) for t, cls, why in _SETUPS if t == text)


def _reference_12_1_7(task: dict) -> dict:
    times = task["stage_times"]
    return {
        "T_seq": profile.sequential_time(times),
        "dominant": profile.dominant_stage(times),
        "speedup_bound": profile.speedup_bound(times, task["accelerate"]),
        "setups": {sid: _setup_class(text)[0] for sid, text in task["setups"].items()},
    }


def _close(given: Any, value: float, rtol: float = 1e-2) -> bool:
    return answers_match(value, given, rtol)


def _mc_amdahl(task: dict) -> _Family:
    ref = _reference_12_1_7(task)
    wrong = ref["T_seq"] / task["stage_times"][task["accelerate"]]

    def accepts(given: Any) -> bool:
        g = _norm_dict(given)
        return g is not None and _close(g.get("speedup_bound"), wrong)

    return _Family({**ref, "speedup_bound": wrong}, accepts)


def _mc_server_async(task: dict) -> _Family:
    ref = _reference_12_1_7(task)
    disagg = [sid for sid, c in ref["setups"].items() if c.startswith("disaggregated/")]
    wrong = {sid: "disaggregated/async" if sid in disagg else c for sid, c in ref["setups"].items()}

    def accepts(given: Any) -> bool:
        g = _norm_dict(given)
        setups = _norm_dict(g.get("setups")) if g is not None else None
        return setups is not None and all(
            _norm(setups.get(_norm(sid))) == "disaggregated/async" for sid in disagg
        )

    return _Family({**ref, "setups": wrong}, accepts)


def _mc_mean(task: dict) -> _Family:
    ref = _reference_12_1_7(task)
    wrong = ref["T_seq"] / len(task["stage_times"])

    def accepts(given: Any) -> bool:
        g = _norm_dict(given)
        return g is not None and _close(g.get("t_seq"), wrong)

    return _Family({**ref, "T_seq": wrong}, accepts)


_KEYS_12_1_7 = ("T_seq", "dominant", "speedup_bound", "setups")
_ONE_STEP_WORDS = ("one_step", "one-step", "one step", "шаг позади", "1-step")


def _validate_12_1_7(answer: Any, task: dict) -> str | None:
    keys = ", ".join(_KEYS_12_1_7)
    g = _norm_dict(answer)
    if g is None:
        return f"Ожидается словарь с ключами {keys}; получено: {type(answer).__name__}."
    missing = [k for k in _KEYS_12_1_7 if _norm(k) not in g]
    extra = [str(k) for k in answer if _norm(k) not in {_norm(x) for x in _KEYS_12_1_7}]
    if missing or extra:
        return (
            f"Ожидается словарь с ключами {keys}; не хватает: {', '.join(missing) or '—'}, "
            f"лишние: {', '.join(extra) or '—'}."
        )
    if not isinstance(g["dominant"], str) or _norm(g["dominant"]) not in task["stage_times"]:
        return (
            f"dominant: назовите этап ключом из task['stage_times'] ({', '.join(task['stage_times'])}), "
            f"получено {g['dominant']!r}."
        )
    setups = _norm_dict(g["setups"])
    ids = {_norm(sid) for sid in task["setups"]}
    if setups is None or set(setups) != ids:
        return f"setups: нужен словарь с ключами {', '.join(task['setups'])}."
    for sid, value in setups.items():
        if isinstance(value, str) and any(w in _norm(value) for w in _ONE_STEP_WORDS):
            return (
                f"setups[{sid.upper()!r}] = {value!r}: «на шаг позади» (one-step-off) — не "
                "третья клетка, а асинхронный режим с задержкой ровно в одну версию (шаг 12.1.3): "
                "запишите размещение и `async`, например `disaggregated/async`."
            )
        if _norm(value) not in SETUP_CLASSES:
            return (
                f"setups[{sid.upper()!r}] = {value!r}: допустимы ровно "
                f"{', '.join(SETUP_CLASSES)} (размещение/синхронность)."
            )
    return None


def _solution_12_1_7(task: dict) -> str:
    times, accel = task["stage_times"], task["accelerate"]
    ref = _reference_12_1_7(task)
    total, dom = ref["T_seq"], ref["dominant"]
    rest = total - times[accel]
    terms = " + ".join(f"{t:.2f}" for t in times.values())
    rows = "\n".join(
        f"| **{sid}** | `{cls}` | {_setup_class(task['setups'][sid])[1]} |"
        for sid, cls in ref["setups"].items()
    )
    answer = {**ref, "T_seq": round(total, 2), "speedup_bound": round(ref["speedup_bound"], 3)}
    return (
        "**1. T_seq.** Этапы идут строго по очереди, поэтому время шага — сумма, а не среднее:\n\n"
        f"$$T_{{seq}} = {terms} = {total:.2f}\\ \\text{{с}}.$$\n\n"
        f"**2. Узкое место** — самый долгий этап: `{dom}` ({profile.STAGE_LABELS_RU[dom]}), "
        f"{times[dom]:.2f} с, то есть {100 * times[dom] / total:.0f} % шага.\n\n"
        f"**3. Предел ускорения (Амдал).** Если `{accel}` ({times[accel]:.2f} с) станет "
        "бесплатным, останутся остальные этапы:\n\n"
        "$$S_{max} = \\frac{T_{seq}}{T_{seq} - T_{\\text{этапа}}} = "
        f"\\frac{{{total:.2f}}}{{{total:.2f} - {times[accel]:.2f}}} = "
        f"\\frac{{{total:.2f}}}{{{rest:.2f}}} \\approx {ref['speedup_bound']:.3f}.$$\n\n"
        f"Отношение T_seq / T_этапа = {total / times[accel]:.3f} — не предел ускорения, а "
        "величина, обратная доле этапа в шаге: ускоряется только эта доля, остальные "
        f"{rest:.2f} с остаются.\n\n"
        "**4. Карта.** Размещение — где работают роли (одни и те же GPU или разные); "
        "синхронность — ждёт ли тренер пакет текущей версии или данные приходят с разными "
        "версиями. Оси независимы: отдельный сервер сам по себе не делает алгоритм асинхронным. "
        "Режимов синхронности два; «на шаг позади» (генерация пакета k + 1 во время обучения "
        "на пакете k) — асинхронный режим с задержкой ровно 1.\n\n"
        "| схема | клетка | почему |\n|---|---|---|\n"
        f"{rows}\n\n"
        f"**Ответ:** `{answer}`."
    )


register(
    Exercise(
        id="12.1.7",
        title="Профиль цикла: T_seq, узкое место, предел ускорения; размещение × синхронность",
        make_task=_task_12_1_7,
        reference=_reference_12_1_7,
        solution=_solution_12_1_7,
        hint=(
            "Этапы последовательного шага не перекрываются: T_seq — их сумма. Если этап стал "
            "бесплатным, шаг длится T_seq − T_этапа (закон Амдала). Для схем задайте два "
            "отдельных вопроса: на одних ли GPU работают генерация и обучение; ждёт ли тренер "
            "пакет, собранный текущими весами."
        ),
        misconceptions=[
            Misconception(
                "amdahl_ratio",
                "Предел ускорения посчитан как T_seq / T_этапа. Это обратная доля этапа, а не "
                "ускорение: если этап станет бесплатным, шаг будет длиться T_seq − T_этапа, "
                "поэтому S_max = T_seq / (T_seq − T_этапа).",
                _mc_amdahl,
            ),
            Misconception(
                "separate_server_async",
                "Все схемы с раздельным размещением отнесены к асинхронным. Отдельный сервер "
                "генерации не делает алгоритм асинхронным (шаг 12.1.3): если тренер ждёт каждый "
                "пакет текущей версии и только потом рассылает веса, схема синхронная.",
                _mc_server_async,
            ),
            Misconception(
                "mean_not_sum",
                "T_seq — среднее время этапа, а нужна сумма: в последовательном шаге этапы идут "
                "друг за другом, и их времена складываются.",
                _mc_mean,
            ),
        ],
        rtol=1e-2,
        compare=_compare,
        validate_answer=_validate_12_1_7,
    )
)
