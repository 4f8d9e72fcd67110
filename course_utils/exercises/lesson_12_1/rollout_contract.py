"""12.1.6 — контракт роллаута: найти непригодные записи пакета и назвать нарушенное правило."""

import math
import random

from course_utils import contract
from course_utils.exercises.answers import Choice, Keyed, md_table, norm
from course_utils.exercises.step import Step, Trap

_BREAKABLE = ("mask_length", "logprob_count", "logprob_positive", "decoding", "policy_version")
_BREAKABLE += ("missing_field",)


def _record(rng: random.Random | None, sid: str, version: int | None) -> dict:
    """Пригодная запись: однократная (маска 0…0 1…1, EOS, логарифмы < 0); rng=None — двухходовая."""
    run, pid, _ = sid.split("-")
    example = contract.example_multiturn_record if rng is None else contract.example_record
    rec = {**example().to_dict(), "sample_id": sid, "policy_version": version}
    rec |= {"trace_id": f"{sid}-v{version}", "prompt_id": pid, "group_id": f"{run}-{pid}"}
    if rng is None:  # ответ инструмента внутри ответа — маска 0, логарифмов нет
        return rec
    n_prompt, n_resp = rng.randint(3, 6), rng.randint(3, 6)
    tokens = [rng.randint(10, 999) for _ in range(n_prompt + n_resp - 1)]  # ответ — без EOS
    rec |= {"prompt_tokens": tokens[:n_prompt], "response_tokens": [*tokens[n_prompt:], 2]}
    rec["policy_mask"] = [0] * n_prompt + [1] * n_resp
    rec["behavior_logprobs"] = [round(-rng.uniform(0.01, 2.5), 2) for _ in range(n_resp)]
    rec["decoding"] = {"temperature": rng.choice([0.7, 0.8, 1.0]), "top_p": rng.choice([1.0, 0.95])}
    return rec | {"reward": {"correctness": float(rng.randint(0, 1)), "format": 1.0}}


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


def _contract_task(variant: int) -> dict:
    rng = random.Random(12_1_6_000 + 7919 * variant)
    n_total = rng.randint(8, 10)
    # mask_prompt и mixed_versions — в каждом пакете: на них держатся ловушки
    broken = ["mask_prompt", "mixed_versions", *rng.sample(_BREAKABLE, rng.randint(1, 2))]
    run = f"run{rng.randint(10, 99)}"
    sids = [f"{run}-p{p:03d}-g{rng.randint(0, 7):02d}" for p in rng.sample(range(1, 200), n_total)]
    v = rng.randint(100, 400)
    records = [_break(rng, _record(rng, s, v), rule, v) for s, rule in zip(sids, broken)]
    multi, per_sid, *rest = sids[len(broken) :]
    per_token = _break(rng, _record(rng, per_sid, v), "mixed_versions", v)
    per_token.update(policy_version=None, trace_id=f"{per_sid}-v{v - 1}-{v}")
    records += [_record(None, multi, v), per_token, *(_record(rng, s, v) for s in rest)]
    rng.shuffle(records)
    statement = (
        f"**Контракт роллаута.** `task_12_1_6['records']` — {n_total} записей (поля — шаг 12.1.2; "
        "таблица — `contract.records_to_frame(task_12_1_6['records'])`). В непригодной записи "
        "нарушено ровно одно правило, прочие пригодны, даже непривычные. Ответ — `{sample_id: "
        "ключ_правила}` для непригодных, без `contract.validate_rollout` (им сверьтесь после). "
        "Правила (`task_12_1_6['rules']`):\n\n"
        + "\n".join(f"- `{key}` — {text}" for key, text in contract.RULES.items())
    )
    return {"statement": statement, "records": records, "rules": dict(contract.RULES)}


def _sids(task: dict) -> list[str]:
    return [r["sample_id"] for r in task["records"]]


def _contract_solve(task: dict) -> dict:
    """{sample_id: нарушенное правило} для непригодных записей (contract.violated_rules)."""
    return {r["sample_id"]: v[0] for r in task["records"] if (v := contract.violated_rules(r))}


def _odd_sids(task: dict) -> tuple[str, str]:  # пригодные: нули маски в ответе; версии токенов
    ok = [r for r in task["records"] if not contract.violated_rules(r)]
    multi = next(r for r in ok if 0 in r["policy_mask"][len(r["prompt_tokens"]) :])
    return multi["sample_id"], next(r["sample_id"] for r in ok if r["policy_version"] is None)


def _contract_solution(task: dict, ref: dict) -> str:
    why = dict.fromkeys(_sids(task), "пригодна")
    notes = ("нули маски в ответе — токены среды", "версии записаны по токенам (шаг 12.1.4)")
    why |= {s: f"пригодна: {note}" for s, note in zip(_odd_sids(task), notes)}
    found = {r["sample_id"]: contract.validate_rollout(r) for r in task["records"]}
    why |= {s: m[0].split("] ", 1)[1] for s, m in found.items() if m}  # без «[правило] »
    rows = [(f"`{s}`", f"`{ref[s]}`" if s in ref else "—", w) for s, w in why.items()]
    table = md_table(("sample_id", "вердикт", "почему"), rows)
    return f"Проверяем правила у каждой записи по порядку.\n\n{table}\n\n**Ответ:** `{ref}`."


def _rules(answer: dict, *drop: str) -> dict:  # без регистра; без записей drop (sid или правило)
    skip = {norm(x) for x in drop}
    return {norm(k): norm(v) for k, v in answer.items() if not skip & {norm(k), norm(v)}}


_ANSWER = Keyed(_sids, Choice(contract.RULES), False, "записей", "{sample_id: ключ_правила}")
_HINT = "Сверьте длины маски, токенов и логарифмов (их — по единицам маски), маску на запросе, знаки логарифмов, версии и decoding. Нули маски в ответе — токены среды."
_TRAPS = (
    Trap(
        "prompt_in_mask",
        "Пропущена маска 1 на запросе: градиент по нему учил бы модель «писать» условие.",
        wrong=lambda t, ref: {k: v for k, v in ref.items() if v != "mask_prompt"},
    ),
    Trap(
        "env_tokens_flagged",
        "Многоходовая запись пригодна: нули маски в ответе — токены среды, не политики.",
        wrong=lambda t, ref: {**ref, _odd_sids(t)[0]: "logprob_count"},
        matches=lambda t, g: _rules(g, _odd_sids(t)[0]) == _rules(_contract_solve(t)),
    ),
    Trap(
        "single_version_ok",
        "Одна метка на токены разных версий — нарушение, а None при версиях токенов — норма.",
        wrong=lambda t, ref: {k: v for k, v in ref.items() if v != "mixed_versions"},
        matches=lambda t, g: (  # mixed_versions пропущена и/или отмечена пригодная
            _rules(g, _odd_sids(t)[1])
            in (_rules(ref := _contract_solve(t)), _rules(ref, "mixed_versions"))
        ),
    ),
)
STEP = Step("12.1.6", _contract_task, _contract_solve, _ANSWER, _HINT, _contract_solution, _TRAPS)
