"""Помощники тестов загрузчиков CSV: прочитать строки файла и записать изменённую копию."""

import csv


def read_rows(path):
    """Строки CSV как список словарей «столбец → текст»."""
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def write_rows(path, rows, columns):
    """Пишет строки в CSV с заголовком ``columns`` (недостающие ячейки пусты); возвращает path."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c, "") for c in columns})
    return path
