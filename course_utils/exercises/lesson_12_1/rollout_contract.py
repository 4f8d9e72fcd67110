"""12.1.6 — контракт роллаута: найти непригодные записи пакета и назвать нарушенное правило."""

from __future__ import annotations

import math
import random
from typing import Any

from course_utils import contract
from course_utils.exercises.answers import Choice, Keyed, md_table, norm
from course_utils.exercises.step import Step, Trap

BREAKABLE = ("mask_length", "logprob_count", "logprob_positive", "decoding", "policy_version",
             "missing_field")  # fmt: skip
ALWAYS_BROKEN = ("mask_prompt", "mixed_versions")  # в каждом пакете: на них держатся ловушки


def _single_turn(rng: random.Random, sid: str, version: int | None) -> dict:
    """Пригодная однократная запись: запрос, ответ с EOS, маска 0…0 1…1, логарифмы < 0."""
    n_prompt, n_resp = rng.randint(3, 6), rng.randint(3, 6)
    run, prompt_id, _ = sid.split("-")
    return contract.RolloutRecord(
        sample_id=sid,
        policy_version=version,
        prompt_tokens=[rng.randint(10, 999) for _ in range(n_prompt)],
        response_tokens=[rng.randint(10, 999) for _ in range(n_resp - 1)] + [2],
        policy_mask=[0] * n_prompt + [1] * n_resp,
        behavior_logprobs=[round(-rng.uniform(0.01, 2.5), 2) for _ in range(n_resp)],
        decoding={"temperature": rng.choice([0.7, 0.8, 1.0]), "top_p": rng.choice([1.0, 0.95])},
        reward={"correctness": float(rng.randint(0, 1)), "format": 1.0},
        stop_reason="eos", verifier_version="arith-v4", trace_id=f"{sid}-v{version}",
        prompt_id=prompt_id, group_id=f"{run}-{prompt_id}",
    ).to_dict()  # fmt: skip


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
        t = rec["decoding"]["temperature"]
        rec["decoding"] = rng.choice([{"temperature": t}, {"temperature": t, "top_p": 0.0}])
    elif rule == "policy_version":  # версию не записали, поточечных версий нет
        rec["policy_version"] = None
    else:  # missing_field: потеряно поле при сериализации
        del rec[rng.choice(["verifier_version", "stop_reason"])]
    assert contract.violated_rules(rec) == [rule], (rule, contract.violated_rules(rec))
    return rec


def make_task(variant: int) -> dict:
    rng = random.Random(12_1_6_000 + 7919 * variant)
    n_total = rng.randint(8, 10)
    broken_rules = [*ALWAYS_BROKEN, *rng.sample(BREAKABLE, rng.randint(1, 2))]
    run = f"run{rng.randint(10, 99)}"
    sids = [f"{run}-p{p:03d}-g{rng.randint(0, 7):02d}" for p in rng.sample(range(1, 200), n_total)]
    version = rng.randint(100, 400)
    records = [_break(rng, _single_turn(rng, sid, version), rule, version)
               for sid, rule in zip(sids, broken_rules)]  # fmt: skip
    rest = sids[len(broken_rules) :]
    records.append(_multiturn(rest[0], version))
    per_token = _single_turn(rng, rest[1], None)
    per_token["token_policy_versions"] = _switch_versions(rng, len(per_token["response_tokens"]), version)  # fmt: skip
    per_token["trace_id"] = f"{rest[1]}-v{version - 1}-{version}"
    records += [per_token] + [_single_turn(rng, sid, version) for sid in rest[2:]]
    assert not any(contract.violated_rules(r) for r in records[len(broken_rules) :])
    rng.shuffle(records)
    rules = "\n".join(f"- `{key}` — {text}" for key, text in contract.RULES.items())
    statement = (
        f"**Контракт роллаута.** В `task['records']` — пакет из {n_total} записей роллаутов "
        "(обычные словари с полями шага 12.1.2; удобно посмотреть таблицей: "
        "`contract.records_to_frame(task['records'])`). Часть записей непригодна для честного "
        "обновления политики, и в каждой такой записи нарушено ровно одно правило контракта. "
        "Остальные записи пригодны — в том числе те, что выглядят непривычно.\n\n"
        "Найдите непригодные записи и для каждой назовите нарушенное правило. Ответ — словарь "
        "`{sample_id: ключ_правила}` только для непригодных записей, например "
        f'`{{"{run}-p000-g00": "decoding"}}`. Ключи правил (они же в `task["rules"]`):\n\n'
        f"{rules}\n\n"
        "Ищите сами, не вызывая `contract.validate_rollout`: в этом смысл шага. "
        "После проверки можно сверить с ним."
    )
    return {"statement": statement, "records": records, "rules": dict(contract.RULES)}


def solve(task: dict) -> dict:
    """{sample_id: первое нарушенное правило} для непригодных записей (contract.violated_rules)."""
    verdicts = {r["sample_id"]: contract.violated_rules(r) for r in task["records"]}
    return {sid: rules[0] for sid, rules in verdicts.items() if rules}


def _valid_with(task: dict, kind: str) -> str:
    """Пригодная запись-ловушка: ``multiturn`` (нули маски в ответе) или ``per_token`` (версии)."""
    for rec in task["records"]:
        resp_mask = rec["policy_mask"][len(rec["prompt_tokens"]) :]
        odd = 0 in resp_mask if kind == "multiturn" else bool(rec.get("token_policy_versions"))
        if odd and not contract.violated_rules(rec):
            return rec["sample_id"]
    raise ValueError(f"в пакете нет записи {kind}")


def _why_valid(rec: dict) -> str:
    resp_mask = rec["policy_mask"][len(rec["prompt_tokens"]) :]
    if 0 in resp_mask:
        return (f"пригодна: нули маски внутри ответа ({resp_mask.count(0)} шт.) — токены среды "
                "(ответ инструмента), политика их не выбирала; логарифмов "
                f"{len(rec['behavior_logprobs'])} — ровно столько, сколько единиц в маске")  # fmt: skip
    if rec.get("policy_version") is None:
        return (f"пригодна: policy_version = None, а версии {sorted(set(rec['token_policy_versions']))} "
                "записаны по токену — это честный способ описать смену весов посреди ответа "
                "(шаг 12.1.4)")  # fmt: skip
    return "пригодна"


def solution(task: dict, ref: dict) -> str:
    rows = [(f"`{r['sample_id']}`", f"`{ref[r['sample_id']]}`",
             contract.validate_rollout(r)[0].split("] ", 1)[1]) if r["sample_id"] in ref
            else (f"`{r['sample_id']}`", "—", _why_valid(r)) for r in task["records"]]  # fmt: skip
    answer = ", ".join(f'"{k}": "{v}"' for k, v in ref.items())
    return (
        "Идём по записям и проверяем правила по порядку: все ли поля на месте; длина маски "
        "равна len(prompt_tokens) + len(response_tokens); на позициях запроса маска 0; число "
        "единиц маски равно числу логарифмов вероятностей; все логарифмы ≤ 0; версия — одно "
        "целое, если весь ответ выбран одной версией, иначе None и поточечные версии; "
        "temperature > 0 и top_p из (0, 1].\n\n"
        + md_table(("sample_id", "вердикт", "почему"), rows)
        + f"\n\n**Ответ:** `{{{answer}}}`.\n\n"
        "Ловушки: нули маски внутри ответа многоходовой записи — не ошибка, а требование "
        "контракта (токены среды не обучаются); запись с `policy_version = None` и поточечными "
        "версиями пригодна, а одна целая метка на ответ, выбранный двумя версиями, — нет."
    )


class _Verdicts(Keyed):
    """{sample_id: правило} для части записей; отзыв считает записи, не называя их."""

    def mismatch(self, expected: Any, given: Any) -> str:
        e = {norm(k): norm(v) for k, v in expected.items()}
        g = {norm(k): norm(v) for k, v in given.items()}
        found = e.keys() & g.keys()
        return (f"Непригодных записей в пакете: {len(e)}. Вы верно отметили {len(found)} из них, "
                f"у {sum(e[k] != g[k] for k in found)} правило названо неверно; лишних (на самом "
                f"деле пригодных) записей в ответе: {len(g.keys() - e.keys())}.")  # fmt: skip


def _norm_rules(answer: dict) -> dict:
    return {norm(k): norm(v) for k, v in answer.items()}


def _env_tokens_flagged(task: dict, given: dict) -> bool:
    """Многоходовая запись отмечена (любым правилом), остальное верно."""
    g, trap = _norm_rules(given), norm(_valid_with(task, "multiturn"))
    return trap in g and {k: v for k, v in g.items() if k != trap} == _norm_rules(solve(task))


def _single_version_ok(task: dict, given: dict) -> bool:
    """Пропущена запись mixed_versions и/или отмечена пригодная запись с поточечными версиями."""
    g, ref = _norm_rules(given), _norm_rules(solve(task))
    trap, mixed = norm(_valid_with(task, "per_token")), next(k for k, v in ref.items() if v == "mixed_versions")  # fmt: skip
    rest = {k: v for k, v in g.items() if k != trap}
    return g != ref and rest in (ref, {k: v for k, v in ref.items() if k != mixed})


STEP = Step(
    id="12.1.6", make_task=make_task, solve=solve, solution=solution,
    answer=_Verdicts(lambda t: [r["sample_id"] for r in t["records"]], Choice(tuple(contract.RULES)),
                     complete=False, noun="записей"),
    hint=(
        "Для каждой записи сравните три длины: маски, запроса + ответа и списка логарифмов "
        "(он равен числу единиц маски, а не длине ответа). Затем посмотрите на позиции "
        "запроса в маске, на знаки логарифмов, на версии и на decoding. Нули маски внутри "
        "ответа — это токены среды, а policy_version = None допустим, если есть поточечные "
        "версии."
    ),
    traps=(
        Trap("prompt_in_mask",
             "Пропущена запись, где маска политики равна 1 на токене запроса. Маска политики "
             "не должна покрывать токены запроса: их не выбирала политика, и градиент по ним "
             "учил бы модель «писать» условие задачи. Это нарушение `mask_prompt`.",
             wrong=lambda t, ref: {k: v for k, v in ref.items() if v != "mask_prompt"}),
        Trap("env_tokens_flagged",
             "Вы отметили многоходовую запись, а она пригодна. Нули маски внутри ответа — "
             "токены среды или инструмента: политика их не выбирала, поэтому маска 0 и для них "
             "нет логарифмов вероятностей. Логарифмов столько, сколько единиц в маске, а не "
             "сколько токенов в ответе.",
             wrong=lambda t, ref: {**ref, _valid_with(t, "multiturn"): "logprob_count"},
             matches=_env_tokens_flagged),
        Trap("single_version_ok",
             "Ошибка с версиями политики. Одна целая метка policy_version на ответ, токены "
             "которого выбраны разными версиями (token_policy_versions различаются), — "
             "нарушение `mixed_versions` (шаг 12.1.4). А запись с policy_version = None и "
             "поточечными версиями, наоборот, пригодна: так честно описывают смену весов "
             "посреди ответа.",
             wrong=lambda t, ref: {k: v for k, v in ref.items() if v != "mixed_versions"},
             matches=_single_version_ok),
    ),
)  # fmt: skip
