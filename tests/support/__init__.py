"""What the tests share and that is not a test: helper functions, fake embedders, real git servers,
the legacy generator, the scripts some tests start as processes, and kb's own test corpus.

Importable as ``support`` because ``tests/`` is on ``sys.path`` (``pythonpath`` in pyproject's
pytest settings). Fixtures live in ``tests/conftest.py``; no test imports from conftest."""
