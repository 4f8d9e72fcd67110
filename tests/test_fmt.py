"""Русская типографика чисел и форм слов (course_utils.fmt)."""

import math

import numpy as np
import pytest

from course_utils.fmt import NBSP, count, listing, num, plural


def test_digit_groups_use_no_break_space_never_comma():
    assert num(494_032_768) == f"494{NBSP}032{NBSP}768"
    assert num(131_072) == f"131{NBSP}072"
    assert num(999) == "999"
    assert num(np.int64(1_000_000)) == f"1{NBSP}000{NBSP}000"
    assert num(5057.4) == f"5{NBSP}057"
    assert num(4.64489, 2) == "4.64"
    assert num(12345.678, 1) == f"12{NBSP}345.7"
    assert num(-1500) == f"−1{NBSP}500"
    assert num(math.nan) == "—"
    assert "," not in num(7_615_616_512)


@pytest.mark.parametrize(
    "n, word",
    [
        (0, "групп"),
        (1, "группа"),
        (2, "группы"),
        (4, "группы"),
        (5, "групп"),
        (11, "групп"),
        (12, "групп"),
        (14, "групп"),
        (21, "группа"),
        (22, "группы"),
        (53, "группы"),
        (104, "группы"),
        (111, "групп"),
        (1001, "группа"),
    ],
)
def test_plural_forms_follow_russian_numerals(n, word):
    assert plural(n, "группа", "группы", "групп") == word


def test_count_joins_number_and_word():
    assert count(53, "группа", "группы", "групп") == f"53{NBSP}группы"
    assert count(1200, "токен", "токена", "токенов") == f"1{NBSP}200{NBSP}токенов"


@pytest.mark.parametrize("bad", [None, "12", True, [1]])
def test_num_refuses_non_numbers(bad):
    with pytest.raises(ValueError, match="x должно быть числом"):
        num(bad)


def test_listing_shows_first_five_and_total():
    assert listing(range(3)) == "0, 1, 2"
    assert listing(range(12)) == "0, 1, 2, 3, 4 … (всего 12)"
    assert listing(["a", "b"], repr, limit=1) == "'a' … (всего 2)"
