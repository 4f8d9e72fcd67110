"""course_utils — общий пакет модуля 12 «Инфраструктура RL для LLM».

Каждый модуль отвечает за одну тему; ноутбуки импортируют их явно,
например ``from course_utils import contract, policy``.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "setup_notebook"]


def setup_notebook(*args, **kwargs):
    """Печатает одну строку окружения (см. course_utils.environment.setup_notebook)."""
    from course_utils.environment import setup_notebook as _setup

    return _setup(*args, **kwargs)
