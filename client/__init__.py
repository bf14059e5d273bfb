"""Typed Python client of the aaren service, and the ``aaren`` command line."""
