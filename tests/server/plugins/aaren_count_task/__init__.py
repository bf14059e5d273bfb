"""A task added as a plug-in only (a test's): this folder plus one entry point of group ``aaren.tasks``.

The task ``count`` keeps, per session, the running count, mean and standard deviation of each value
(``task.py``; its "model" is one learnt scale per value); ``outputs.py``, ``aaren_v1.py`` and ``oip.py``
are its typed outputs and codecs, ``spec.py`` its registry line (nothing here but ``task.py`` imports
torch). ``tests/server/test_task_plugin.py`` installs it with an entry point and serves it.
"""
