"""Тесты course_utils.weight_sync: двойной буфер, барьер, проверка, аудит журнала, процессы.

Уровень A — на настоящей крошечной модели курса (две версии весов: исходная и после шума).
Уровень C — один запуск трёх процессов (тренер и два генератора, gloo, ~10 с на 2 ядрах).
"""

from __future__ import annotations

import copy
import math
import os
import re

import pandas as pd
import pytest
import torch

from course_utils import multiproc, policy, weight_sync
from course_utils.multiproc import weight_broadcast
from course_utils.multiproc.transport import ROLE_GENERATOR, ROLE_TRAINER, state_checksum
from course_utils.weight_audit import AUDIT_RULES, audit_log
from course_utils.weight_sync import (
    EVENT_FIELDS,
    EVENT_TYPES,
    EventLog,
    InProcessEngine,
    _logits as reference_logits,
    make_replicas,
    probe_input,
    publish,
)

ENTRY = "course_utils.multiproc.weight_broadcast:broadcast_weights"
SIZES = [1_000, 100_000, 1_000_000]


def _perturbed(model, seed, scale=0.02):
    new = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return new


@pytest.fixture(scope="module")
def models():
    base, _, _ = policy.load_policy("tiny", device="cpu")
    return base, _perturbed(base, 1), _perturbed(base, 2)


def _requests(model, n=6):
    return [probe_input(model, batch=1, length=10, seed=100 + i) for i in range(n)]


def _codes(messages):
    return {re.match(r"\[(\w+)\]", m).group(1) for m in messages}


# ----------------------------------------------------------------------------- уровень A: движок


def test_engine_reports_served_version(models):
    base, new, _ = models
    engine = InProcessEngine(base, version=5, name="r0")
    assert engine.version == 5 and engine.staging_version is None
    assert engine.active_checksum == state_checksum(base)
    out = engine.serve(lambda model, version: (version, model.training))
    assert out.output == (5, False) and out.version == 5 and out.replica == "r0"
    res = engine.forward(probe_input(base))
    assert res.version == 5 and torch.equal(res.logits, reference_logits(base, probe_input(base)))
    kinds = [e["event"] for e in engine.log]
    assert kinds == ["init", "serve", "serve"]
    # движок держит свои копии: веса тренера можно менять, движок это не затронет
    assert engine.weights()["model.norm.weight"].data_ptr() != base.model.norm.weight.data_ptr()
    # state_dict с привязанным lm_head.weight тоже принимается
    engine.stage(new.state_dict(), 6)
    assert engine.staging_version == 6 and engine.version == 5


def test_atomic_publish_requests_see_old_or_new_bitwise(models):
    base, new, _ = models
    engines = make_replicas(base, 2)
    reqs = _requests(base)
    report = publish(engines, new, 1, requests=reqs)
    assert report.committed and [e.version for e in engines] == [1, 1]
    assert report.torn_reads == 0
    labels = []
    for x, row, logits in zip(reqs, report.requests, report.outputs):
        # Независимые эталоны: forward исходной модели и модели новой версии.
        old_ref, new_ref = reference_logits(base, x), reference_logits(new, x)
        assert not torch.equal(old_ref, new_ref)
        equals_old, equals_new = torch.equal(logits, old_ref), torch.equal(logits, new_ref)
        assert equals_old != equals_new, row  # ровно одна версия, побитно
        assert (row["matches_old"], row["matches_new"]) == (equals_old, equals_new)
        assert row["served_version"] == (0 if equals_old else 1)  # метка честная
        assert row["read_consistent"] and not row["torn"]
        labels.append(row["served_version"])
    assert labels == sorted(labels) and set(labels) == {0, 1}  # видели и старую, и новую
    for e in engines:
        assert e.checksum() == e.active_checksum == state_checksum(new)
    assert audit_log(report.log) == []
    assert report.requests_frame().shape[0] == len(reqs)
    assert "переключены все реплики" in report.summary()


def test_request_started_before_commit_finishes_on_old_buffer(models):
    base, new, _ = models
    engine = InProcessEngine(base)
    probe = probe_input(base)
    engine.stage(new, 1)
    engine.verify(engine.expected_checksum(new), probe, reference_logits(new, probe))
    engine.ready()
    x = _requests(base, 1)[0]

    def commit_midway(i):
        if i == 2:
            engine.commit()

    res = engine.forward(x, between_layers=commit_midway, track_reads=True)
    assert engine.version == 1  # переключились посреди запроса
    assert res.version == 0 and res.read_consistent
    assert torch.equal(res.logits, reference_logits(base, x))  # дочитал старый буфер
    after = engine.forward(x)
    assert after.version == 1 and torch.equal(after.logits, reference_logits(new, x))


def test_torn_mode_produces_and_detects_mixed_read(models):
    base, new, _ = models
    engines = make_replicas(base, 2)
    reqs = _requests(base)
    report = publish(engines, new, 1, atomic=False, requests=reqs)
    assert not report.atomic and [e.version for e in engines] == [1, 1]
    mixed = 0
    for x, row, logits in zip(reqs, report.requests, report.outputs):
        # независимо от публикатора: равен ли ответ эталону одной из версий
        equals_old = torch.equal(logits, reference_logits(base, x))
        equals_new = torch.equal(logits, reference_logits(new, x))
        assert (row["matches_old"], row["matches_new"]) == (equals_old, equals_new)
        if not equals_old and not equals_new:
            mixed += 1
            # проверка обязана поймать каждое смешанное чтение
            assert row["torn"] and not row["read_consistent"], row
        else:
            assert not row["torn"] and row["served_version"] == (0 if equals_old else 1)
    assert mixed >= 1, "рваный режим не дал смешанного чтения — опыт не показывает проблему"
    assert report.torn_reads == mixed
    torn_events = [e for e in report.log if e["event"] == "torn_read"]
    assert len(torn_events) == mixed
    assert all(e["version"] == 0 for e in torn_events)  # помечены старой версией
    codes = _codes(audit_log(report.log))
    assert {"torn_read", "inplace_update", "commit_without_verify"} <= codes


def test_torn_read_is_a_real_mix_of_versions(models):
    """Смешанное чтение — не порча: ответ равен ответу модели-гибрида из слоёв двух версий."""
    base, new, _ = models
    engine = InProcessEngine(base)
    x = _requests(base, 1)[0]
    steps = engine.unsafe_update_steps(new, 1)
    names = engine.param_names
    n_written = 1 + 3 * 12  # эмбеддинги и слои 0–2 (по 12 тензоров в блоке Qwen2)
    assert names[n_written - 1].startswith("model.layers.2.") and names[n_written].startswith(
        "model.layers.3."
    )

    def write_before_layer_2(i):
        if i == 2:
            for _ in range(n_written):
                next(steps)

    res = engine.forward(x, between_layers=write_before_layer_2, track_reads=True)
    assert res.version == 0 and res.read_consistent is False
    # Что прочитано: эмбеддинги, слои 0–1 — старые (прочитаны до записи), слой 2 — новый,
    # слой 3 и norm — старые (ещё не записаны), lm_head (связан с эмбеддингами) — новый.
    hybrid = copy.deepcopy(base)
    with torch.no_grad():
        for (name, p), q in zip(hybrid.named_parameters(), new.parameters()):
            if name.startswith("model.layers.2."):
                p.copy_(q)
        hybrid.lm_head.weight = torch.nn.Parameter(new.model.embed_tokens.weight.detach().clone())
    assert torch.equal(res.logits, reference_logits(hybrid, x))
    assert not torch.equal(res.logits, reference_logits(base, x))
    assert not torch.equal(res.logits, reference_logits(new, x))
    for _ in steps:
        pass
    assert engine.version == 1 and engine.checksum() == state_checksum(new)


def test_barrier_no_replica_serves_new_version_before_all_ready(models):
    base, new, _ = models
    engines = make_replicas(base, 3)
    report = publish(engines, new, 1, requests=_requests(base, 9))
    assert report.committed
    events = report.log.to_list()
    idx = {
        k: [i for i, e in enumerate(events) if e["event"] == k and e["version"] == 1]
        for k in EVENT_TYPES
    }
    assert len(idx["ready"]) == 3 and len(idx["barrier"]) == 1 and len(idx["commit"]) == 3
    last_ready = max(idx["ready"])
    assert last_ready < idx["barrier"][0] < min(idx["commit"])
    assert max(idx["verify_ok"]) < min(idx["ready"])
    served_new = idx["serve"]
    assert served_new and min(served_new) > max(idx["commit"])
    # коммиты подряд: между ними нет запросов
    assert max(idx["commit"]) - min(idx["commit"]) == 2


def test_corrupted_staging_fails_verification_and_nobody_commits(models):
    base, new, _ = models
    engines = make_replicas(base, 2)
    report = publish(engines, new, 1, corrupt="replica-1", requests=_requests(base, 4))
    assert not report.committed
    assert [e.version for e in engines] == [0, 0]
    assert [e.staging_version for e in engines] == [None, None]
    ok0, bad1 = report.verify_results
    assert ok0.ok and not bad1.ok and bad1.checksum_ok is False
    kinds = [(e["event"], e["replica"]) for e in report.log if e["version"] == 1]
    assert ("verify_fail", "replica-1") in kinds and ("abort", "publisher") in kinds
    assert not any(k == "commit" for k, _ in kinds) and not any(k == "barrier" for k, _ in kinds)
    assert all(r["served_version"] == 0 and r["matches_old"] for r in report.requests)
    assert audit_log(report.log) == []  # отказ — правильное поведение, не нарушение
    assert "abort" in report.summary()
    # следующая попытка с целыми весами проходит
    assert publish(engines, new, 1).committed and engines[1].version == 1


def test_checksum_catches_corruption_below_logits_tolerance(models):
    base, new, _ = models
    engine = InProcessEngine(base)
    probe = probe_input(base)
    engine.stage(new, 1)
    engine.weights("staging")["model.layers.1.mlp.down_proj.weight"].view(-1)[7] += 1e-6
    res = engine.verify(engine.expected_checksum(new), probe, reference_logits(new, probe))
    assert not res.ok and res.checksum_ok is False
    assert res.max_abs_diff is not None and res.max_abs_diff < 1e-3
    with pytest.raises(RuntimeError, match="переключаться нельзя"):
        engine.commit()
    assert engine.version == 0


def test_consecutive_versions_reuse_the_buffer_pair(models):
    base, new, newer = models
    engines = make_replicas(base, 2)
    assert publish(engines, new, 1).committed
    assert publish(engines, newer, 2).committed  # та же пара буферов, следующая версия
    assert [e.version for e in engines] == [2, 2] and audit_log(engines[0].log) == []


def test_sleep_level_two_discards_weights_and_wake_reload_restores_them(models):
    base, new, _ = models
    x = probe_input(base)
    engine = InProcessEngine(base)
    engine.sleep()
    with pytest.raises(RuntimeError, match="спит"):
        engine.forward(x)
    engine.wake()  # без перечитывания веса остаются выброшенными
    assert torch.isnan(engine.forward(x).logits).all()
    engine.sleep()
    engine.wake(new)  # reload_weights: веса с «диска», метка версии не меняется
    assert engine.version == 0 and engine.checksum() == engine.expected_checksum(new)
    assert torch.equal(engine.forward(x).logits, reference_logits(new, x))


def test_publish_to_sleeping_engine_then_wake_serves_published_version(models):
    base, new, other = models
    x = probe_input(base)
    engine = InProcessEngine(base)
    engine.sleep()
    report = publish(engine, new, 1)  # проверка проходит: буфер пишется целиком
    assert report.committed and engine.version == 1
    engine.wake()  # исправленный путь (TRL PR #5313): перечитывать нечего
    assert torch.equal(engine.forward(x).logits, reference_logits(new, x))
    engine.sleep()
    publish(engine, other, 2)
    engine.wake(base)  # сломанный путь (TRL #5312): исходный чекпойнт поверх версии 2
    assert engine.version == 2 and engine.active_checksum == engine.expected_checksum(other)
    assert engine.checksum() == engine.expected_checksum(
        base
    )  # заявлено одно, обслуживается другое
    assert torch.equal(engine.forward(x).logits, reference_logits(base, x))


def test_event_log_frame_and_schema(models):
    base, new, _ = models
    engines = make_replicas(base, 2)
    publish(engines, new, 1)
    frame = engines[0].log.frame()
    assert list(frame.columns) == list(EVENT_FIELDS)
    assert set(frame["event"]) <= set(EVENT_TYPES)
    assert frame["seq"].tolist() == list(range(len(frame)))
    assert frame["t"].is_monotonic_increasing
    assert audit_log(frame) == []  # аудит принимает и таблицу pandas


# ----------------------------------------------------------------------------- аудит журнала


def _ev(event, replica, version, **kw):
    return {"event": event, "replica": replica, "version": version, **kw}


def _clean_log():
    a, b, c = "A" * 64, "B" * 64, "C" * 64
    log = [_ev("init", r, 0, checksum=a) for r in ("r0", "r1")]
    log += [_ev("serve", "r0", 0, checksum=a, request_id="q0")]
    for version, ck in ((1, b), (2, c)):
        for r in ("r0", "r1"):
            log += [
                _ev("stage_start", r, version, buffer="staging"),
                _ev("stage_done", r, version, checksum=ck, buffer="staging"),
                _ev("verify_ok", r, version, checksum=ck, expected_checksum=ck),
                _ev("ready", r, version),
            ]
        log += [_ev("barrier", "publisher", version)]
        log += [_ev("commit", r, version, checksum=ck) for r in ("r0", "r1")]
        log += [
            _ev("serve", r, version, checksum=ck, request_id=f"q{version}{r}") for r in ("r0", "r1")
        ]
    return log


def _without(log, pred):
    return [e for e in log if not pred(e)]


def _find(log, event, replica, version):
    return next(
        i
        for i, e in enumerate(log)
        if (e["event"], e["replica"], e["version"]) == (event, replica, version)
    )


def test_audit_clean_log_is_empty():
    assert audit_log(_clean_log()) == []
    assert audit_log([]) == []
    assert set(AUDIT_RULES) >= {
        "serve_before_barrier",
        "commit_without_verify",
        "version_backwards",
        "replicas_diverged",
        "checksum_mismatch",
    }


def test_audit_serve_before_barrier():
    log = _without(_clean_log(), lambda e: e["event"] == "barrier" and e["version"] == 1)
    # r0 переключается и обслуживает v1, когда r1 ещё даже не начала запись
    for kind in ("commit", "serve"):
        ev = log.pop(_find(log, kind, "r0", 1))
        log.insert(_find(log, "stage_start", "r1", 1), ev)
    msgs = audit_log(log)
    assert _codes(msgs) == {"serve_before_barrier", "commit_before_barrier", "replicas_diverged"}
    text = next(m for m in msgs if m.startswith("[serve_before_barrier]"))
    assert "r0" in text and "r1" in text


def test_audit_commit_before_barrier_and_barrier_not_ready():
    log = _clean_log()
    i = _find(log, "ready", "r1", 2)
    ready = log.pop(i)
    log.insert(_find(log, "barrier", "publisher", 2) + 1, ready)  # ready после барьера
    codes = _codes(audit_log(log))
    assert codes == {"barrier_not_ready"}
    log = _clean_log()
    commit = log.pop(_find(log, "commit", "r0", 1))
    log.insert(_find(log, "ready", "r1", 1), commit)  # переключилась, не дождавшись r1
    assert _codes(audit_log(log)) == {"commit_before_barrier"}


def test_audit_commit_without_verify():
    log = _without(
        _clean_log(),
        lambda e: e["event"] == "verify_ok" and e["replica"] == "r1" and e["version"] == 2,
    )
    assert _codes(audit_log(log)) == {"commit_without_verify"}
    log = _clean_log()
    i = _find(log, "verify_ok", "r0", 1)
    log[i] = {**log[i], "event": "verify_fail", "checksum": "D" * 64}
    msgs = audit_log(log)
    assert _codes(msgs) == {"commit_without_verify"} and "verify_fail" in msgs[0]


def test_audit_version_backwards():
    log = _clean_log() + [_ev("commit", "r1", 1, checksum="B" * 64)]
    assert "version_backwards" in _codes(audit_log(log))
    log = _clean_log() + [_ev("serve", "r0", 1, checksum="B" * 64, request_id="late")]
    assert _codes(audit_log(log)) == {"version_backwards", "replicas_diverged"}


def test_audit_replicas_diverged():
    log = _clean_log()
    # r1 не переключилась на 2 (нет её коммита), но продолжает обслуживать 1
    log = _without(
        log,
        lambda e: e["version"] == 2 and e["replica"] == "r1" and e["event"] in ("commit", "serve"),
    )
    log.append(_ev("serve", "r1", 1, checksum="B" * 64, request_id="stale"))
    msgs = audit_log(log)
    assert _codes(msgs) == {"replicas_diverged"}
    assert any("r1 обслуживает версию 1" in m and "r0: 2" in m for m in msgs)


def test_audit_replicas_diverged_only_after_a_switch():
    # Правило: «после переключения (commit) хотя бы одной реплики на версию реплики обслуживают
    # разные версии». Запрос из staging до любого commit — serve_uncommitted и
    # serve_before_barrier, а не разошедшиеся реплики (раньше audit_log называл и его).
    assert "после переключения" in AUDIT_RULES["replicas_diverged"]
    log = _clean_log()
    i = _find(log, "stage_done", "r0", 1)
    log.insert(i + 1, _ev("serve", "r0", 1, checksum="B" * 64, request_id="from-staging"))
    codes = _codes(audit_log(log))
    assert codes == {"serve_uncommitted", "serve_before_barrier"}
    # А между commit r0 и commit r1 реплика r1 ещё отвечает версией 0: r0 уже переключилась.
    log = _clean_log()
    i = _find(log, "commit", "r0", 1)
    log.insert(i + 1, _ev("serve", "r1", 0, checksum="A" * 64, request_id="window"))
    msgs = audit_log(log)
    assert _codes(msgs) == {"replicas_diverged"}
    assert any("r1 обслуживает версию 0" in m and "r0: 1" in m for m in msgs)


def test_russian_headers_and_digit_groups():
    frame = pd.DataFrame({"size": [10_000, 4_000_000], "bytes": [40_000, 16_000_000],
                          "seconds": [0.001, 0.01], "repeats": [3, 3]})  # fmt: skip
    shown = weight_sync.russian(frame)
    assert list(shown.columns) == ["параметров", "байт", "рассылка, с (медиана)", "повторов"]
    assert shown["параметров"].tolist() == ["10\u00a0000", "4\u00a0000\u00a0000"]
    assert shown["повторов"].tolist() == [3, 3]  # малые целые остаются числами
    assert list(frame.columns) == ["size", "bytes", "seconds", "repeats"]  # исходная не тронута
    report_cols = ["request_id", "replica", "served_version", "matches_old", "matches_new"]
    report_cols += ["read_consistent", "torn", "outcome"]
    assert all(re.search("[а-яА-Я=|]", weight_sync.COLUMN_NAMES[c]) for c in report_cols)


def test_audit_checksum_mismatch():
    log = _clean_log()
    i = _find(log, "commit", "r1", 2)
    log[i] = {**log[i], "checksum": "E" * 64}
    assert _codes(audit_log(log)) == {"checksum_mismatch"}
    log = _clean_log()
    i = _find(log, "verify_ok", "r0", 1)
    log[i] = {**log[i], "checksum": "E" * 64}  # проверка «прошла», хотя суммы разные
    assert "checksum_mismatch" in _codes(audit_log(log))
    log = _clean_log()
    i = _find(log, "serve", "r0", 2)
    log[i] = {**log[i], "checksum": "E" * 64}
    assert _codes(audit_log(log)) == {"checksum_mismatch"}


def test_audit_serve_uncommitted_inplace_and_torn():
    log = _clean_log()
    log = _without(
        log, lambda e: e["event"] == "commit" and e["replica"] == "r1" and e["version"] == 2
    )
    codes = _codes(audit_log(log))
    assert "serve_uncommitted" in codes
    log = _clean_log()
    i = _find(log, "stage_start", "r0", 2)
    log[i] = {**log[i], "buffer": "active"}
    log.append(_ev("torn_read", "r0", 1, request_id="q-torn"))
    assert _codes(audit_log(log)) == {"inplace_update", "torn_read"}


def test_audit_sorts_by_time_and_messages_are_russian():
    log = _clean_log()
    for k, e in enumerate(log):
        e["t"] = float(k)
    shuffled = list(reversed(log))
    assert audit_log(shuffled) == []
    bad = _without(log, lambda e: e["event"] == "barrier")
    bad = _without(bad, lambda e: e["event"] == "ready" and e["replica"] == "r1")
    msgs = audit_log(bad)
    assert msgs and all(re.search("[а-яА-Я]", m) for m in msgs)
    assert len(msgs) == len(set(msgs))


def test_audit_bad_inputs():
    with pytest.raises(ValueError, match="events"):
        audit_log("журнал")
    with pytest.raises(ValueError, match="event"):
        audit_log([_ev("comit", "r0", 1)])
    with pytest.raises(ValueError, match="version"):
        audit_log([_ev("serve", "r0", None)])
    with pytest.raises(ValueError, match="replica"):
        audit_log([_ev("serve", "", 1)])
    with pytest.raises(ValueError, match=r"events\[0\]"):
        audit_log([42])


# ----------------------------------------------------------------------------- неверные входы


def test_bad_inputs(models):
    base, new, _ = models
    with pytest.raises(ValueError, match="model"):
        InProcessEngine("модель")
    with pytest.raises(ValueError, match="version"):
        InProcessEngine(base, version=-1)
    engine = InProcessEngine(base)
    with pytest.raises(ValueError, match="version должна расти"):
        engine.stage(new, 0)
    sd = dict(new.named_parameters())
    with pytest.raises(ValueError, match="state_dict"):
        engine.stage({k: v for k, v in list(sd.items())[1:]}, 1)
    with pytest.raises(ValueError, match="форма"):
        engine.stage({**sd, "model.norm.weight": torch.zeros(3)}, 1)
    with pytest.raises(ValueError, match="state_dict"):
        engine.stage({**sd, "лишний": torch.zeros(1)}, 1)
    with pytest.raises(ValueError, match="input_ids"):
        engine.forward(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="input_ids"):
        engine.forward(torch.tensor([[10_000]]))
    with pytest.raises(RuntimeError, match="переключаться нельзя"):
        engine.commit()
    with pytest.raises(RuntimeError, match="не готова"):
        engine.ready()
    with pytest.raises(ValueError, match="buffer"):
        engine.weights("третий")
    engines = make_replicas(base, 2)
    with pytest.raises(ValueError, match="corrupt"):
        publish(engines, new, 1, corrupt="replica-9")
    with pytest.raises(ValueError, match="corrupt"):
        publish(engines, new, 1, corrupt="replica-0", atomic=False)
    with pytest.raises(ValueError, match="atomic"):
        publish(engines, new, 1, atomic="да")
    with pytest.raises(ValueError, match="один журнал"):
        publish([InProcessEngine(base, name="a"), InProcessEngine(base, name="b")], new, 1)
    with pytest.raises(ValueError, match="engines"):
        publish([], new, 1)
    with pytest.raises(ValueError, match="n"):
        make_replicas(base, 0)
    with pytest.raises(ValueError, match="batch"):
        probe_input(base, batch=0)
    with pytest.raises(ValueError, match="event"):
        EventLog().add("взрыв", "r0", 1)
    assert [e.version for e in engines] == [0, 0]  # неудачные вызовы ничего не сломали


def test_publish_requests_must_be_a_list_of_inputs(models):
    base, new, _ = models
    engines = make_replicas(base, 2)
    for bad in (probe_input(base, batch=2), 5):  # тензор раньше давал RuntimeError torch
        with pytest.raises(ValueError, match="requests должно быть списком тензоров"):
            publish(engines, new, 1, requests=bad)
    assert [e.version for e in engines] == [0, 0]


def test_counts_accept_integral_floats(models):
    base, new, _ = models
    assert torch.equal(
        probe_input(base, batch=2.0, length=5.0, seed=3.0), probe_input(base, 2, 5, 3)
    )
    engines = make_replicas(base, 2.0)
    report = publish(engines, new, 1.0, requests=_requests(base, 2))
    assert report.committed and report.version == 1 and [e.version for e in engines] == [1, 1]
    assert [r["request_id"] for r in report.requests] == [
        "replica-0/v1-req-0",
        "replica-1/v1-req-1",
    ]
    assert audit_log(report.log) == []
    engine = InProcessEngine(base)
    engine.stage(new, 1)
    name = engine.corrupt_staging()
    flat = engine.weights("staging")[name].view(-1)
    assert flat[0] == dict(new.named_parameters())[name].view(-1)[0] + 1.0
    for bad in (1.5, True):
        with pytest.raises(ValueError, match="batch должно быть целым ≥ 1"):
            probe_input(base, batch=bad)


@pytest.mark.parametrize("event", [[], {}, ["init"]])
def test_unhashable_event_kind_is_a_value_error(event):
    with pytest.raises(ValueError, match="event должно быть одним из"):
        EventLog().add(event, "r0", 0)
    with pytest.raises(ValueError, match=r"events\[0\]: поле event"):
        audit_log([{"event": event, "replica": "r0", "version": 0}])


def test_broadcast_weights_bad_inputs():
    call = weight_broadcast.broadcast_weights
    with pytest.raises(ValueError, match="world_size"):
        call(rank=0, world_size=1, backend="gloo")
    with pytest.raises(ValueError, match="versions"):
        call(rank=0, world_size=3, backend="gloo", versions=0)
    with pytest.raises(ValueError, match="sizes"):
        call(rank=0, world_size=3, backend="gloo", sizes=[0])
    with pytest.raises(ValueError, match="sizes"):
        call(rank=0, world_size=3, backend="gloo", sizes="1000")
    with pytest.raises(ValueError, match="corrupt_version"):
        call(rank=0, world_size=3, backend="gloo", versions=2, corrupt_version=3)
    with pytest.raises(ValueError, match="corrupt_rank"):
        call(rank=0, world_size=3, backend="gloo", corrupt_rank=0)
    with pytest.raises(ValueError, match="launch_result"):
        weight_broadcast.sync_frame([{"rank": 0}])
    with pytest.raises(ValueError, match="launch_result"):
        weight_broadcast.sync_size_frame("итог")


# ----------------------------------------------------------------------------- уровень C: процессы


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    args = {"versions": 3, "sizes": SIZES, "repeats": 2, "corrupt_version": 2, "corrupt_rank": 2}
    res = multiproc.launch(
        ENTRY, nprocs=3, args=args, timeout_s=120, run_dir=tmp_path_factory.mktemp("ws")
    )
    assert res.ok, res.summary()
    return res


def test_distributed_generators_serve_published_version(run):
    trainer, gen1, gen2 = run.results
    assert [r["role"] for r in run.results] == [ROLE_TRAINER, ROLE_GENERATOR, ROLE_GENERATOR]
    assert len({r["pid"] for r in run.results} | {os.getpid()}) == 4
    # версия 2 испорчена на ранге 2: переключения нет нигде, генераторы остаются на 1
    for r in run.results:
        assert [v["committed"] for v in r["versions"]] == [True, False, True]
    assert [v["generators_served"] for v in trainer["versions"]] == [[1, 1], [1, 1], [3, 3]]
    assert [v["published_version"] for v in trainer["versions"]] == [1, 2, 3]
    for g in (gen1, gen2):
        assert [v["served_version"] for v in g["versions"]] == [1, 1, 3]
        assert [v["served_matches_reference"] for v in g["versions"]] == [True, False, True]
        assert g["final_version"] == 3
    assert [v["checksum_ok"] for v in gen1["versions"]] == [True, True, True]
    assert [v["checksum_ok"] for v in gen2["versions"]] == [True, False, True]
    assert len({r["checksum"] for r in run.results}) == 1  # все на одних и тех же весах
    model, _, _ = policy.load_policy("tiny", device="cpu")
    assert state_checksum(model) != trainer["checksum"]
    for r in run.results:
        for v in r["versions"]:
            assert v["bytes"] == 4 * r["num_params"]


def test_distributed_event_log_passes_audit(run):
    events = weight_broadcast.merged_events(run)
    assert audit_log(events) == []
    kinds = {(e["event"], e["version"]) for e in events}
    assert ("abort", 2) in kinds and ("verify_fail", 2) in kinds and ("commit", 3) in kinds
    assert ("commit", 2) not in kinds


def test_sync_frames(run):
    frame = weight_broadcast.sync_frame(run)
    assert len(frame) == 3 * 3
    assert frame["version"].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    gens = frame[frame["role"] == ROLE_GENERATOR]
    for col in ("broadcast_s", "verify_s", "barrier_s", "commit_s"):
        assert (gens[col] >= 0).all() and gens[col].map(math.isfinite).all()
    assert frame[frame["role"] == ROLE_TRAINER]["verify_s"].isna().all()
    sizes = weight_broadcast.sync_size_frame(run)
    assert sizes["size"].tolist() == SIZES
    assert sizes["bytes"].tolist() == [4 * s for s in SIZES]
    assert (sizes["seconds"] > 0).all() and (sizes["trainer_s"] > 0).all()
    assert isinstance(sizes, pd.DataFrame) and "gib_per_s" in sizes
    assert sizes["repeats"].tolist() == [2] * len(SIZES)  # повторов на размер — для подписи графика
