"""One config I/O for every dataclass config of aaren_core: train configs and model configs.

A config is a frozen dataclass that mixes in ``ConfigRecord``. It is written as the plain dict of
its fields (``to_dict``: nested configs as dicts, tuples as lists, so the record is JSON) and read
back by ``from_dict``, which refuses unknown keys and converts every value to its field's type by
the one rule of ``coerce``: the same rule for a checkpoint's stored record, a ``.json``/``.toml``
file (``read_config_file``) and the command line's ``--set KEY=VALUE`` (``parse_sets``).
``command_line`` writes a config back as the ``aaren train`` command that runs it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

__all__ = [
    "TRUE",
    "ConfigRecord",
    "coerce",
    "coerce_fields",
    "command_line",
    "field_defaults",
    "fields_of",
    "format_value",
    "parse_sets",
    "read_config_file",
]

#: The one boolean rule: these strings (any case) are true, ``FALSE`` are false, anything else is an error.
TRUE = ("true", "1", "yes")
FALSE = ("false", "0", "no")
#: Strings that mean None for a field that may be None.
NONE = ("auto", "none")


def coerce(owner: str, key: str, value: Any, hint: Any) -> Any:
    """``value`` converted to the type ``hint`` of field ``key`` (``owner`` names the config in errors).

    Strings (from ``--set``) are parsed: ``auto``/``none`` is None where None is allowed; a bool is
    one of ``TRUE``/``FALSE``; a list or tuple is comma-separated; numbers by ``int``/``float``
    (an ``int`` field refuses a fractional float). A nested config takes its record (a dict).
    """
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if type(None) in args and (value is None or (isinstance(value, str) and value.strip().lower() in NONE)):
            return None
        hint = next(a for a in args if a is not type(None))
        args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return value
    if origin in (list, tuple):
        items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else list(value)
        element = args[0] if args else Any
        converted = [coerce(owner, key, v, element) for v in items]
        return converted if origin is list else tuple(converted)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type) and issubclass(hint, ConfigRecord):
        return value if isinstance(value, hint) else hint.from_dict(value)
    if hint is bool:
        if isinstance(value, str):
            if value.strip().lower() not in TRUE + FALSE:
                raise ValueError(f"{owner}: {key}={value!r}; expected true or false")
            return value.strip().lower() in TRUE
        return bool(value)
    if hint in (int, float, str):
        try:
            if hint is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            return hint(value)
        except (TypeError, ValueError):
            raise ValueError(f"{owner}: {key}={value!r}; expected {hint.__name__}") from None
    return value


def coerce_fields(cls: type, data: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """``data`` with every value converted to its field's type; ``ValueError`` for a key ``cls`` lacks."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(f"{owner}: unknown keys {unknown}; expected some of {sorted(names)}")
    hints = typing.get_type_hints(cls)
    return {k: coerce(owner, k, v, hints[k]) for k, v in data.items()}


def fields_of(base: type, config: object) -> dict[str, Any]:
    """The values ``config`` holds for the fields of the dataclass ``base`` (a base both configs
    share, e.g. ``BackboneSizes`` of a train config for its ``BackboneConfig``)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(base)}


def _plain(x: Any) -> Any:
    if isinstance(x, ConfigRecord):
        return x.to_dict()
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _plain(dataclasses.asdict(x))
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x


C = TypeVar("C", bound=type)


def field_defaults(**defaults: Any) -> typing.Callable[[C], C]:
    """A class decorator, below ``@dataclasses.dataclass``: the fields of the dataclass bases that
    ``defaults`` names take these defaults in this class, their type and place in the field order
    staying the base's. So a config that shares a base's field (``TrainKnobs.lr``) with another
    default says only the value, not the field again. ``TypeError`` for a name no base declares or
    one the class declares itself."""

    def with_defaults(cls: C) -> C:
        inherited = {
            f.name: f for base in cls.__mro__[:0:-1] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)
        }
        own = dict(inspect.get_annotations(cls))
        if unknown := sorted(set(defaults) - set(inherited)):
            raise TypeError(f"{cls.__name__}: field_defaults names {unknown}, which no dataclass base declares")
        if declared := sorted(set(defaults) & set(own)):
            raise TypeError(f"{cls.__name__}: field_defaults names {declared}, which the class declares itself")
        for name, value in defaults.items():
            own[name] = inherited[name].type
            setattr(cls, name, value)
        cls.__annotations__ = own
        return cls

    return with_defaults


class ConfigRecord:
    """The dict form of a frozen dataclass config: ``to_dict``, ``from_dict``, ``replace``.

    ``CONFIG_NAME`` names the config in error messages (``"train config: unknown keys [...]"``).
    """

    CONFIG_NAME: ClassVar[str] = "config"
    #: Keys the record writes ahead of the others (which follow in field order). A dataclass base's
    #: fields come first in field order, so a config that takes shared fields from a base
    #: (``aaren_core.nn.backbones.BackboneSizes``) names here the keys it has always led with.
    RECORD_LEADS: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON values: nested configs as dicts, tuples as lists."""
        record = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return {**{key: record[key] for key in self.RECORD_LEADS}, **record}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """A config from a record or from ``--set`` strings; missing keys take their defaults."""
        return cls(**coerce_fields(cls, data, cls.CONFIG_NAME))

    def require(self, checks: Mapping[str, bool]) -> None:
        """``ValueError`` naming every expectation of ``checks`` (what is expected -> whether it
        holds) that fails: ``"train config: expected epochs >= 1, lr > 0"``."""
        failed = [expected for expected, holds in checks.items() if not holds]
        if failed:
            raise ValueError(f"{self.CONFIG_NAME}: expected {', '.join(failed)}")

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (converted like ``from_dict``)."""
        return dataclasses.replace(self, **coerce_fields(type(self), changes, self.CONFIG_NAME))  # type: ignore[type-var]


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The table of config keys in a ``.json`` or ``.toml`` file."""
    path = Path(path)
    if path.suffix.lower() == ".toml":
        data = tomllib.loads(path.read_text())
    elif path.suffix.lower() == ".json":
        data = json.loads(path.read_text())
    else:
        raise ValueError(f"{path}: expected a .json or .toml train config")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a table of config keys")
    return data


def parse_sets(items: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` items (``--set``) as a dict; ``-`` in a key reads as ``_``."""
    changes: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{item!r}: expected KEY=VALUE")
        changes[key.strip().replace("-", "_")] = value
    return changes


def format_value(value: Any) -> str:
    """A config value as ``--set`` reads it back: lowercase booleans, comma-separated lists."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)


def command_line(
    config: ConfigRecord,
    default: ConfigRecord,
    *,
    prefix: str = "aaren train",
    flags: Sequence[str] = (),
    always: Sequence[str] = (),
    skip: Sequence[str] = (),
) -> str:
    """The command that runs ``config``: ``prefix``; ``--KEY VALUE`` for each key of ``always`` in
    that order (unless empty); then, in field order, ``--KEY VALUE`` for the keys in ``flags`` and
    ``--set KEY=VALUE`` for the others that differ from ``default``; keys in ``skip`` are left out."""
    values, defaults = config.to_dict(), default.to_dict()
    parts = [prefix] + [
        f"--{key.replace('_', '-')} {format_value(values[key])}" for key in always if values[key] not in ("", None)
    ]
    for key, value in values.items():
        if key in skip or key in always or value == defaults[key]:
            continue
        if key in flags:
            parts.append(f"--{key.replace('_', '-')} {format_value(value)}")
        else:
            parts.append(f"--set {key}={format_value(value)}")
    return " ".join(parts)
