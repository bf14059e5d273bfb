"""The bundled model repository: ``aaren serve`` serves every sub-folder holding a checkpoint.

- ``default``: the event model ``aaren-flights`` (the 2013 New York departures);
- ``series-power``: the series model ``aaren-series-power`` (household power, 24 hours ahead);
- ``class-vowels``: the classification model ``aaren-class-vowels`` (JapaneseVowels, 9 speakers).

Each folder holds ``model.safetensors`` and ``config.json`` (what the server loads) beside its
``metrics.json``, ``report.md`` and plots. The folder installs as the package ``aaren.models``
(setup.py maps it; the files are package data), so a wheel carries the models and
``aaren.server.settings.bundled_repository()`` finds them where the package is installed, in a
checkout (editable install) as in site-packages. Nothing here is imported: the folder is read as files.
"""
