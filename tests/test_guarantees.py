"""Семь гарантий и предполётная проверка описания запуска."""

import pytest

from course_utils import guarantees


def test_seven_guarantees_and_full_run_passes():
    assert len(guarantees.GUARANTEES) == 7
    table = guarantees.preflight(guarantees.example_runs()["full"])
    assert len(table) == 7 and table["выполнена"].all()
    assert (table["чего не хватает"] == "").all()


def test_quick_prototype_gaps_are_named():
    table = guarantees.preflight(guarantees.example_runs()["quick"]).set_index("гарантия")
    assert not table["выполнена"].any()
    text = " ".join(table["чего не хватает"])
    for expected in (
        "правила декодирования",
        "версий по токенам нет",
        "нет поля policy_mask",
        "порог в записях",
        "нет ограничения задержки",
        "нет свойства синхронизации: atomic_switch",
        "не хранит rng",
        "принудительным сбоем",
        "в трассе нет optimizer_step",
    ):
        assert expected in text, expected


@pytest.mark.parametrize(
    "key, value, broken",
    [
        ("queue_limit", "rollouts", "3."),
        ("sync", ["version_id", "atomic_switch", "readiness_barrier"], "5."),
        ("crash_tested", False, "6."),
        ("off_policy_correction", False, "4."),
    ],
)
def test_one_missing_item_breaks_exactly_one_guarantee(key, value, broken):
    run = dict(guarantees.example_runs()["full"], **{key: value})
    table = guarantees.preflight(run)
    failed = table.loc[~table["выполнена"], "гарантия"].tolist()
    assert len(failed) == 1 and failed[0].startswith(broken)


def test_synchronous_run_needs_no_queue_limit_and_bad_input():
    run = dict(guarantees.example_runs()["full"], asynchronous=False, queue_limit=None)
    run.pop("max_policy_lag")
    assert guarantees.preflight(run)["выполнена"].all()
    with pytest.raises(ValueError, match="run"):
        guarantees.preflight(["не словарь"])
    with pytest.raises(ValueError, match="неизвестные ключи"):
        guarantees.preflight({"gpu": "H100"})
    with pytest.raises(ValueError, match="queue_limit"):
        guarantees.preflight({"queue_limit": "байты"})
