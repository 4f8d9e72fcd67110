#!/usr/bin/env bash
# Подготовка окружения Colab для модуля 12.
#
# Ставит только то, чего в Colab нет (по умолчанию — simpy), и никогда не ставит и не обновляет
# torch, transformers, numpy, pandas, matplotlib, ipywidgets: их версии Colab согласованы между
# собой, а обновление уже импортированного пакета требует перезапуска среды.
# Повторный запуск ничего не меняет. Код выхода ≠ 0, если обязательного пакета по-прежнему нет.
#
# Переменные для тестов: COURSE_PY — интерпретатор (по умолчанию python3),
# COURSE_PIP — команда установки (по умолчанию "$COURSE_PY -m pip install -q").
set -u
cd "$(dirname "$0")"

PY="${COURSE_PY:-python3}"
PIP="${COURSE_PIP:-$PY -m pip install -q}"

# Пакеты, которые Colab обязан дать сам: их не трогаем.
PREINSTALLED="torch transformers numpy pandas matplotlib ipywidgets"
# Пакеты, которые можно доставить, если их нет (границы берутся из requirements.txt).
INSTALLABLE="simpy pyarrow tqdm psutil tokenizers accelerate"

version_of() {
  "$PY" - "$1" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    print(version(sys.argv[1]))
except PackageNotFoundError:
    sys.exit(1)
PYEOF
}

requirement_of() {
  # Строка требования из requirements.txt без комментария, например "simpy>=4.1".
  local line
  line=$(grep -E "^$1([<>=! ]|$)" requirements.txt | head -n 1 | sed 's/#.*//; s/[[:space:]]*$//')
  echo "${line:-$1}"
}

missing_required=()
to_install=()

for pkg in $PREINSTALLED; do
  if v=$(version_of "$pkg"); then
    echo "[OK]   $pkg $v"
  else
    echo "[FAIL] $pkg не найден (этот пакет скрипт не ставит: он должен быть в среде Colab)"
    missing_required+=("$pkg")
  fi
done

for pkg in $INSTALLABLE; do
  if v=$(version_of "$pkg"); then
    echo "[OK]   $pkg $v"
  else
    to_install+=("$(requirement_of "$pkg")")
  fi
done

if [ ${#to_install[@]} -gt 0 ]; then
  echo "Устанавливаю недостающее: ${to_install[*]}"
  # shellcheck disable=SC2086
  $PIP "${to_install[@]}" || echo "[FAIL] установка завершилась с ошибкой"
  for req in "${to_install[@]}"; do
    pkg=$(echo "$req" | sed -E 's/[<>=!].*//')
    if v=$(version_of "$pkg"); then
      echo "[OK]   $pkg $v (установлен)"
    else
      echo "[FAIL] $pkg так и не установлен"
      missing_required+=("$pkg")
    fi
  done
fi

if [ ${#missing_required[@]} -gt 0 ]; then
  echo "Не хватает обязательных пакетов: ${missing_required[*]}." >&2
  echo "Проверьте, что выбрана стандартная среда Colab, и перезапустите ячейку установки." >&2
  exit 1
fi
echo "Окружение готово."
