"""12.1.6 — контракт роллаута: найти непригодные записи пакета и назвать нарушенное правило."""

import math
import random

from course_utils import contract
from course_utils.exercises.answers import Choice, Keyed, md_table, norm
from course_utils.exercises.step import Step, Trap

BREAKABLE = ("mask_length", "logprob_count", "logprob_positive", "decoding", "policy_version",
             "missing_field")  # fmt: skip
ALWAYS_BROKEN = ("mask_prompt", "mixed_versions")  # есть в каждом пакете: на них держатся ловушки


def _record(rng: random.Random | None, sid: str, version: int | None) -> dict:
    """Пригодная запись: однократная (маска 0…0 1…1, EOS, логарифмы < 0); rng=None — двухходовая."""
    run, prompt_id, _ = sid.split("-")
    ids = {"sample_id": sid, "policy_version": version, "trace_id": f"{sid}-v{version}",
           "prompt_id": prompt_id, "group_id": f"{run}-{prompt_id}"}  # fmt: skip
    if rng is None:  # ответ инструмента внутри ответа — маска 0, логарифмов нет
        return {**contract.example_multiturn_record().to_dict(), **ids}
    n_prompt, n_resp = rng.randint(3, 6), rng.randint(3, 6)
    return contract.RolloutRecord(**ids,
        prompt_tokens=[rng.randint(10, 999) for _ in range(n_prompt)],
        response_tokens=[rng.randint(10, 999) for _ in range(n_resp - 1)] + [2],
        policy_mask=[0] * n_prompt + [1] * n_resp,
        behavior_logprobs=[round(-rng.uniform(0.01, 2.5), 2) for _ in range(n_resp)],
        decoding={"temperature": rng.choice([0.7, 0.8, 1.0]), "top_p": rng.choice([1.0, 0.95])},
        reward={"correctness": float(rng.randint(0, 1)), "format": 1.0},
        stop_reason="eos", verifier_version="arith-v4").to_dict()  # fmt: skip


def _break(rng: random.Random, rec: dict, rule: str, version: int) -> dict:
    """Портит пригодную однократную запись так, чтобы нарушилось ровно правило ``rule``."""
    mask, logprobs = rec["policy_mask"], rec["behavior_logprobs"]
    if rule == "mask_prompt":  # маска сдвинута на токен влево: последний токен запроса = 1
        mask[len(rec["prompt_tokens"]) - 1] = 1
        logprobs.insert(0, round(-rng.uniform(0.5, 3.0), 2))
    elif rule == "mask_length":  # лишний ноль в конце маски
        mask.append(0)
    elif rule == "logprob_count":  # потерян логарифм вероятности EOS
        logprobs.pop()
    elif rule == "logprob_positive":  # записали вероятности вместо их логарифмов
        logprobs[:] = [round(math.exp(x), 2) for x in logprobs]
    elif rule == "mixed_versions":  # веса v − 1 → v сменились посреди ответа, а метка одна
        k, n = rng.randint(1, len(rec["response_tokens"]) - 1), len(rec["response_tokens"])
        rec["token_policy_versions"] = [version - 1] * k + [version] * (n - k)
    elif rule == "decoding":  # настройки декодирования записаны не полностью или неверно
        t = rec["decoding"]["temperature"]
        rec["decoding"] = rng.choice([{"temperature": t}, {"temperature": t, "top_p": 0.0}])
    elif rule == "policy_version":  # версию не записали, поточечных версий нет
        rec["policy_version"] = None
    else:  # missing_field: поле потеряно при сериализации
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
    records = [_break(rng, _record(rng, sid, version), rule, version)
               for sid, rule in zip(sids, broken_rules)]  # fmt: skip
    multi, per_sid, *rest = sids[len(broken_rules) :]
    per_token = _break(rng, _record(rng, per_sid, version), "mixed_versions", version)
    per_token.update(policy_version=None, trace_id=f"{per_sid}-v{version - 1}-{version}")
    records += [_record(None, multi, version), per_token, *(_record(rng, s, version) for s in rest)]
    assert not any(contract.violated_rules(r) for r in records[len(broken_rules) :])
    rng.shuffle(records)
    rules = "\n".join(f"- `{key}` — {text}" for key, text in contract.RULES.items())
    statement = (
        f"**Контракт роллаута.** В `task_12_1_6['records']` — пакет из {n_total} записей роллаутов "
        "(поля — из шага 12.1.2; таблица: `contract.records_to_frame(task_12_1_6['records'])`). "
        "Часть записей непригодна для честного обновления политики: в каждой нарушено ровно одно "
        "правило контракта. Остальные пригодны — и те, что выглядят непривычно. Ответ — словарь "
        f'`{{sample_id: ключ_правила}}` только для непригодных, например `{{"{run}-p000-g00": '
        '"decoding"}`. Ключи правил (они же в `task_12_1_6["rules"]`):\n\n'
        f"{rules}\n\nИщите сами, без `contract.validate_rollout`; после проверки сверьте с ним."
    )
    return {"statement": statement, "records": records, "rules": dict(contract.RULES)}


def solve(task: dict) -> dict:
    """{sample_id: нарушенное правило} для непригодных записей (contract.violated_rules)."""
    return {r["sample_id"]: v[0] for r in task["records"] if (v := contract.violated_rules(r))}


def _trap_sid(task: dict, kind: str) -> str:
    """Пригодная запись-ловушка: ``multiturn`` (нули маски в ответе) или ``per_token`` (версии)."""
    odd = {"multiturn": lambda r: 0 in r["policy_mask"][len(r["prompt_tokens"]) :],
           "per_token": lambda r: bool(r.get("token_policy_versions"))}[kind]  # fmt: skip
    return next(r["sample_id"] for r in task["records"]
                if odd(r) and not contract.violated_rules(r))  # fmt: skip


def solution(task: dict, ref: dict) -> str:
    why = {_trap_sid(task, "multiturn"): "пригодна: нули маски внутри ответа — токены среды "
           "(ответ инструмента); логарифмов столько, сколько единиц маски",
           _trap_sid(task, "per_token"): "пригодна: policy_version = None, а версии записаны "
           "по токену — честная запись смены весов посреди ответа (шаг 12.1.4)"}  # fmt: skip
    rows = [(f"`{sid}`", f"`{ref[sid]}`", contract.validate_rollout(r)[0].split("] ", 1)[1])
            if sid in ref else (f"`{sid}`", "—", why.get(sid, "пригодна"))
            for sid, r in ((r["sample_id"], r) for r in task["records"])]  # fmt: skip
    answer = ", ".join(f'"{k}": "{v}"' for k, v in ref.items())
    return (
        "Проверяем у каждой записи правила контракта по порядку (ключи — в условии).\n\n"
        f"{md_table(('sample_id', 'вердикт', 'почему'), rows)}\n\n**Ответ:** `{{{answer}}}`."
    )


def _rules(answer: dict, *drop: str) -> dict:  # без регистра; без записей drop (sid или правило)
    skip = {norm(x) for x in drop}
    return {norm(k): norm(v) for k, v in answer.items() if not skip & {norm(k), norm(v)}}


STEP = Step(
    id="12.1.6", make_task=make_task, solve=solve, solution=solution,
    answer=Keyed(lambda t: [r["sample_id"] for r in t["records"]], Choice(tuple(contract.RULES)),
                 complete=False, noun="записей"),
    hint="Сравните длины маски, запроса + ответа и логарифмов (их — по числу единиц маски), затем "
         "маску на запросе, знаки логарифмов, версии и decoding. Нули маски в ответе — токены "
         "среды; policy_version = None допустим при поточечных версиях.",
    traps=(
        Trap("prompt_in_mask",
             "Пропущена запись, где маска политики равна 1 на токене запроса (`mask_prompt`). "
             "Запрос политика не выбирала: градиент по нему учил бы модель «писать» условие.",
             wrong=lambda t, ref: {k: v for k, v in ref.items() if v != "mask_prompt"}),
        Trap("env_tokens_flagged",
             "Отмечена многоходовая запись, а она пригодна: нули маски внутри ответа — токены "
             "среды, политика их не выбирала; логарифмов — по числу единиц маски, а не токенов.",
             wrong=lambda t, ref: {**ref, _trap_sid(t, "multiturn"): "logprob_count"},
             matches=lambda t, g: _rules(g, _trap_sid(t, "multiturn"))  # отмечена, прочее верно
             == _rules(solve(t)) != _rules(g)),
        Trap("single_version_ok",
             "Ошибка с версиями: одна метка policy_version на ответ из токенов разных версий — "
             "нарушение `mixed_versions` (шаг 12.1.4), а None с поточечными версиями — пригодна.",
             wrong=lambda t, ref: {k: v for k, v in ref.items() if v != "mixed_versions"},
             matches=lambda t, g: _rules(g) != _rules(solve(t)) and _rules(g, _trap_sid(  # и/или
                 t, "per_token")) in (_rules(solve(t)), _rules(solve(t), "mixed_versions"))),
    ),
)  # fmt: skip
