"""convoq benchmarks: ``python -m bench`` runs them all, ``python -m bench NAME`` one.

Each benchmark is a module with a ``main() -> None`` that prints its own table; register
it in :data:`bench.__main__.BENCHMARKS`.
"""
