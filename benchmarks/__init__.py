"""The measuring tools: runners, one per question, over the tests' case grid and counter
(``tests/programs.py``, ``tests/hlo.py``); results under ``results/<device>/``."""
