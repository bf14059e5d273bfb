"""The one training loop of every task (``loop.py``); the tasks supply its hooks (``aaren_core.tasks.*.train``)."""
