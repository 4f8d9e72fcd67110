"""Итоговый прогон: настоящие процессы, SIGKILL тренера, аудит семи гарантий по файлам прогона."""

import json
import shutil

import pandas as pd
import pytest

from course_utils import capstone
from course_utils.capstone import SYNC_LOG
from course_utils.contract import read_parquet, write_parquet
from course_utils.guarantees import GUARANTEES

SPECS = capstone.SPECS_DIR


def _failed(run_dir) -> list[str]:
    return [g["name"] for g in capstone.audit(run_dir) if not g["holds"]]


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """Эталон через CLI с kill -9 тренера после шага 3 (точки на шагах 2, 4, 6): один прогон на
    модуль — его читают все тесты ниже, подделки — копии."""
    out = tmp_path_factory.mktemp("capstone") / "killed"
    argv = ["run", "--spec", str(SPECS / "reference.json"), "--out", str(out)]
    assert capstone.main([*argv, "--kill-trainer-at", "3"]) == 0
    return out, json.loads((out / capstone.METRICS).read_text())


def test_reference_passes_audit_via_cli(killed_run, capsys):
    out, metrics = killed_run
    capsys.readouterr()
    assert capstone.main(["audit", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["guarantees"]
    assert [(r["name"], r["label"]) for r in rows] == list(GUARANTEES)
    assert all(r["holds"] and r["evidence"] for r in rows)
    lag = rows[2]["figure"]
    assert lag["max_lag_versions"] == 1 and set(lag["lag_histogram"]) == {"0", "1"}
    assert rows[2]["figure"]["peak_queue_tokens"] <= 192
    assert report["metrics"] == metrics and metrics["steps"] == 6
    assert len(read_parquet(out / capstone.ROLLOUTS)) == 6 * 2 * 4  # шаги × задачи × группа
    # C каждой записанной точки: шаг 2 (первый процесс), 4 и 6 (второй); период шага — из журнала
    assert len(metrics["checkpoint_write_s"]) == 3 and min(metrics["checkpoint_write_s"]) > 0
    assert metrics["step_period_s"] > 0


def test_reference_with_real_sigkill_resumes_the_same_sequence(killed_run):
    out, metrics = killed_run
    first, second = metrics["launches"]
    assert first["exitcodes"][0] == -9 and second["exitcodes"] == [0, 0, 0]  # SIGKILL тренера
    assert first["pids"][0] != second["pids"][0]
    rows = {r["name"]: r for r in capstone.audit(out)}
    assert all(r["holds"] for r in rows.values()), rows
    fig = rows["full_checkpoint"]["figure"]
    assert fig["trainer_processes"] == 2 and fig["recomputed_steps"] == [3]
    assert fig["recomputed_identical"] and fig["missing_components"] == []


def test_uninterrupted_reference_passes_and_matches_the_killed_run(killed_run, tmp_path):
    """Без аварии эталон тоже проходит аудит, и убитый-возобновлённый прогон повторяет его
    последовательность событий: пакеты, роллауты, версии и SHA-256 весов после каждого шага."""
    capstone.run(capstone.Spec.from_json(SPECS / "reference.json"), tmp_path / "plain")
    assert _failed(tmp_path / "plain") == []
    keys = ["optimizer_step", "training_batch_id", "rollout_ids", "trainer_policy_version"]
    keys += ["resulting_policy_version", "weights_sha256"]

    def sequence(run_dir):  # шаг, посчитанный дважды (до и после SIGKILL), берём последним
        steps = pd.read_csv(run_dir / capstone.TRACE_STEPS)[keys]
        return steps.drop_duplicates("optimizer_step", keep="last").reset_index(drop=True)

    killed, plain = sequence(killed_run[0]), sequence(tmp_path / "plain")
    assert len(plain) == 6 and plain["weights_sha256"].nunique() == 6  # веса меняются каждый шаг
    pd.testing.assert_frame_equal(killed, plain)


def test_report_card_and_plot_show_the_audited_figures(killed_run):
    out, _ = killed_run
    card = capstone.report_card(out)
    assert list(card.columns) == ["гарантия", "выполнена", "измерено", "граница", "доказательство"]
    assert card["гарантия"].tolist() == [label for _, label in GUARANTEES]
    assert set(card["выполнена"]) == {"да"} and "peak_queue_tokens = 192" in card["измерено"][2]
    fig, (aq, al) = capstone.plot_run(out)
    steps = pd.read_csv(out / capstone.TRACE_STEPS)
    queue, threshold = aq.get_lines()[:2]
    assert list(queue.get_ydata()) == steps["reserved_tokens"].tolist()
    assert list(threshold.get_ydata()) == [192, 192]
    lag, bound = al.get_lines()[:2]
    records = read_parquet(out / capstone.ROLLOUTS)
    by_step = {
        t: max(t - 1 - r.policy_version for r in records if r.sample_id[1:5] == f"{t:04d}")
        for t in range(1, 7)
    }  # пакет t обучает версия t − 1
    assert list(lag.get_ydata()) == list(by_step.values()) and list(bound.get_ydata()) == [1, 1]


@pytest.mark.parametrize(
    "spec, steps, broken",
    [  # шагов ровно столько, чтобы поломка проявилась: публикация v1 — перед пакетом 3,
        ("broken_no_lag_bound.json", 3, "bounded_queue"),  # пакет 3 из версии 0: L = 2 > 1
        ("broken_weights_only.json", 4, "full_checkpoint"),  # kill после 3, точка на шаге 2
        ("broken_no_barrier.json", 3, "atomic_sync"),  # commit версии 1 без барьера
    ],
)
def test_broken_spec_fails_exactly_its_guarantee(tmp_path, spec, steps, broken):
    capstone.run(capstone.Spec.from_json(SPECS / spec, total_steps=steps), tmp_path / "run")
    assert _failed(tmp_path / "run") == [broken]


def _copy(killed_run, tmp_path):
    return shutil.copytree(killed_run[0], tmp_path / "tampered")


def test_relabelled_record_fails_behavior_policy(killed_run, tmp_path):
    out = _copy(killed_run, tmp_path)
    records = read_parquet(out / capstone.ROLLOUTS)
    victim = next(r for r in records if r.policy_version == 1 and r.sample_id.startswith("b0003"))
    victim.policy_version = 2  # другая версия, задержка всё ещё ≥ 0 и в границе
    write_parquet(records, out / capstone.ROLLOUTS)  # сумма SHA-256 пересчитана: файл «честный»
    assert _failed(out) == ["behavior_policy"]


def test_removed_trace_join_fails_trace_chain(killed_run, tmp_path):
    out = _copy(killed_run, tmp_path)
    trace = pd.read_csv(out / capstone.TRACE_ROLLOUTS)
    trace.iloc[1:].to_csv(out / capstone.TRACE_ROLLOUTS, index=False)
    assert _failed(out) == ["trace_chain"]


def test_sync_entry_without_barrier_fails_atomic_sync(killed_run, tmp_path):
    out = _copy(killed_run, tmp_path)
    lines = (out / SYNC_LOG).read_text().splitlines()
    first = next(i for i, x in enumerate(lines) if json.loads(x)["event"] == "barrier")
    (out / SYNC_LOG).write_text("\n".join(lines[:first] + lines[first + 1 :]) + "\n")
    rows = {r["name"]: r for r in capstone.audit(out)}
    assert [k for k, r in rows.items() if not r["holds"]] == ["atomic_sync"]
    assert "commit_without_barrier" in rows["atomic_sync"]["evidence"][0]
    assert capstone.report_card(out)["выполнена"].tolist() == ["да"] * 4 + ["НЕТ"] + ["да"] * 2


def test_spec_is_validated_in_russian(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"gpu": "H100"}))
    with pytest.raises(ValueError, match="неизвестные ключи"):
        capstone.Spec.from_json(bad)
    with pytest.raises(ValueError, match="stale_strategy"):
        capstone.Spec(stale_strategy="drop")
    with pytest.raises(ValueError, match="queue_tokens"):
        capstone.Spec(queue_tokens=10)
    with pytest.raises(ValueError, match="кратно checkpoint_every"):
        capstone.Spec(kill_trainer_at=4)
    with pytest.raises(ValueError, match="не каталог прогона"):
        capstone.audit(tmp_path)
    with pytest.raises(ValueError, match="не пуст"):
        (tmp_path / "x").mkdir()
        (tmp_path / "x" / "f").write_text("")
        capstone.run(capstone.Spec(), tmp_path / "x")


def test_capstone_checkpoint_speaks_the_course_vocabulary():
    """Компоненты полной точки итогового прогона — имена из checkpoint.COMPONENTS (шаг 12.5.6), а
    отсутствующие — ровно те, чьего состояния у прогона нет (нет планировщика, учебной программы и
    нормировки наград)."""
    from course_utils.checkpoint import COMPONENTS

    assert set(capstone.FULL_COMPONENTS) <= set(COMPONENTS)
    assert set(COMPONENTS) - set(capstone.FULL_COMPONENTS) == {
        "scheduler",
        "curriculum",
        "normalizer",
    }
