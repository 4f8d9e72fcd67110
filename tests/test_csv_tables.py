"""Строгое чтение маленьких CSV курса."""

import pytest

from course_utils.csv_tables import read_exact_csv


class Broken(ValueError):
    pass


def test_rows_are_stripped_and_numbered(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("a,b\n x ,1\ny, 2 \n", encoding="utf-8")
    assert read_exact_csv(p, ("a", "b"), "таблица", Broken) == [
        (2, {"a": "x", "b": "1"}),
        (3, {"a": "y", "b": "2"}),
    ]
    p.write_text("a,b\nx,1\n\nz\n", encoding="utf-8")  # пустая строка пропущена, нет поля — ""
    assert read_exact_csv(p, ("a", "b"), "таблица", Broken) == [
        (2, {"a": "x", "b": "1"}),
        (4, {"a": "z", "b": ""}),
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("a\nx\n", "не хватает столбцов: b"),
        ("a,b,c\nx,1,2\n", "лишние столбцы: c"),
        ("b,a\n1,x\n", "порядок столбцов b, a"),
        ("a,b\n", "нет ни одной строки"),
        ("a,b\nx,1,2\n", "строка 2: полей 3, а столбцов 2"),
    ],
)
def test_errors_name_the_file_and_problem(tmp_path, text, message):
    p = tmp_path / "t.csv"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(Broken, match=message) as err:
        read_exact_csv(p, ("a", "b"), "таблица", Broken)
    assert str(p) in str(err.value)
    with pytest.raises(FileNotFoundError):
        read_exact_csv(tmp_path / "нет.csv", ("a", "b"), "таблица", Broken)
