"""course_utils — общий пакет модуля 12 «Инфраструктура RL для LLM».

Каждый модуль отвечает за одну тему; ноутбуки импортируют их явно,
например ``from course_utils import contract, policy``.
"""

__version__ = "0.1.0"

from course_utils.environment import setup_notebook  # noqa: E402 — строка окружения ноутбука

__all__ = ["__version__", "setup_notebook"]
