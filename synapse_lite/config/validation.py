"""Reading YAML into typed config, reporting every problem with its file and key.

Config sections read themselves through a :class:`Section`, which records a
problem (rather than raising) for each bad or unknown key, so that one run of
the loader reports every mistake in a file at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, TypeVar

import attr
import yaml

T = TypeVar("T")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ConfigProblem:
    """One mistake: where (file and key path) and what."""

    file: str
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.path}" if self.path else self.file
        return f"{where}: {self.message}"


class ConfigError(Exception):
    """The configuration cannot be used; ``problems`` lists every reason."""

    def __init__(self, problems: Iterable[ConfigProblem]) -> None:
        self.problems = list(problems)
        super().__init__(str(self))

    def __str__(self) -> str:
        if len(self.problems) == 1:
            return f"Invalid configuration: {self.problems[0]}"
        lines = [f"Invalid configuration ({len(self.problems)} problems):"]
        lines.extend(f"  - {p}" for p in self.problems)
        return "\n".join(lines)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: Marks a key that has no default.
REQUIRED: Any = _Required()


def load_yaml_file(path: str) -> dict[str, Any]:
    """Parse one YAML config file into a mapping, with errors that name the
    file and line."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError([ConfigProblem(path, "", "file not found")]) from None
    except OSError as e:
        raise ConfigError([ConfigProblem(path, "", f"cannot be read: {e.strerror}")]) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        raise ConfigError(
            [ConfigProblem(path, "", f"is not valid YAML ({where}): {e.problem}")]
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError([ConfigProblem(path, "", f"is not valid YAML: {e}")]) from None
    except UnicodeDecodeError:
        raise ConfigError([ConfigProblem(path, "", "is not UTF-8 text")]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            [ConfigProblem(path, "", f"must be a mapping of keys to values, not a {_kind(data)}")]
        )
    return data


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


_BYTE_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)B?\s*$", re.IGNORECASE)
_BYTE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_byte_size(value: object) -> int | None:
    """Bytes from an integer or ``50M``-style text (K, M, G: powers of 1024);
    None if it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = _BYTE_SIZE.match(value)
        if match:
            return int(match.group(1)) * _BYTE_UNITS[match.group(2).upper()]
    return None


class Section:
    """A mapping being read; knows where it came from and collects problems."""

    def __init__(
        self,
        data: Any,
        file: str,
        path: str = "",
        problems: list[ConfigProblem] | None = None,
    ) -> None:
        self.file = file
        self.path = path
        self.problems: list[ConfigProblem] = problems if problems is not None else []
        self._read: set[str] = set()
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.problem(f"must be a mapping, not a {_kind(data)}")
            data = {}
        self.data: dict[str, Any] = data

    def key_path(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def problem(self, message: str, key: str | int | None = None) -> None:
        path = self.path if key is None else self.key_path(key)
        self.problems.append(ConfigProblem(self.file, path, message))

    def keys(self) -> list[str]:
        """Every key of the mapping, each counted as read."""
        keys = [str(k) for k in self.data]
        self._read.update(self.data)
        return keys

    def _get(self, key: str, default: Any) -> tuple[bool, Any]:
        self._read.add(key)
        if key in self.data:
            return True, self.data[key]
        if default is REQUIRED:
            self.problem("is required", key)
        return False, default

    def get_str(
        self, key: str, default: Any = REQUIRED, choices: Iterable[str] | None = None
    ) -> Any:
        found, value = self._get(key, default)
        if not found:
            return value
        if not isinstance(value, str):
            self.problem(f"must be a string, not a {_kind(value)}", key)
            return default if default is not REQUIRED else ""
        if choices is not None:
            allowed = list(choices)
            if value not in allowed:
                self.problem(f"must be one of {', '.join(allowed)}, not {value!r}", key)
                return default if default is not REQUIRED else allowed[0]
        return value

    def get_optional_str(self, key: str) -> str | None:
        found, value = self._get(key, None)
        if not found or value is None:
            return None
        if not isinstance(value, str):
            self.problem(f"must be a string, not a {_kind(value)}", key)
            return None
        return value

    def get_int(
        self,
        key: str,
        default: Any = REQUIRED,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> Any:
        found, value = self._get(key, default)
        if not found:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(f"must be an integer, not a {_kind(value)}", key)
            return default if default is not REQUIRED else 0
        if minimum is not None and value < minimum:
            self.problem(f"must be at least {minimum}, not {value}", key)
        if maximum is not None and value > maximum:
            self.problem(f"must be at most {maximum}, not {value}", key)
        return value

    def get_float(self, key: str, default: Any = REQUIRED, minimum: float | None = None) -> Any:
        found, value = self._get(key, default)
        if not found:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.problem(f"must be a number, not a {_kind(value)}", key)
            return default if default is not REQUIRED else 0.0
        if minimum is not None and value < minimum:
            self.problem(f"must be at least {minimum}, not {value}", key)
        return float(value)

    def get_byte_size(self, key: str, default: Any = REQUIRED, minimum: int = 0) -> Any:
        """A number of bytes: an integer, or text like ``512K``, ``50M``, ``1G``."""
        found, value = self._get(key, default)
        if not found:
            return value
        size = parse_byte_size(value)
        if size is None or size < minimum:
            self.problem(
                f"must be a number of bytes (at least {minimum}) or a size like '50M' or"
                f" '1G', not {value!r}",
                key,
            )
            return default if default is not REQUIRED else minimum
        return size

    def get_bool(self, key: str, default: Any = REQUIRED) -> Any:
        found, value = self._get(key, default)
        if not found:
            return value
        if not isinstance(value, bool):
            self.problem(f"must be true or false, not a {_kind(value)}", key)
            return default if default is not REQUIRED else False
        return value

    def get_str_list(self, key: str, default: Any = REQUIRED, allow_single: bool = False) -> Any:
        """A list of strings (or, with ``allow_single``, one string)."""
        found, value = self._get(key, default)
        if not found:
            return value
        if allow_single and isinstance(value, str):
            return [value]
        if not isinstance(value, list):
            self.problem(f"must be a list of strings, not a {_kind(value)}", key)
            return []
        result = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self.problem(f"must be a string, not a {_kind(item)}", f"{key}[{i}]")
            else:
                result.append(item)
        return result

    def get_section(self, key: str) -> Section:
        _, value = self._get(key, {})
        return Section(value, self.file, self.key_path(key), self.problems)

    def get_list_of_sections(self, key: str, default: Any = REQUIRED) -> list[Section]:
        found, value = self._get(key, default)
        if not found:
            return [] if value is REQUIRED or value is None else value
        if not isinstance(value, list):
            self.problem(f"must be a list, not a {_kind(value)}", key)
            return []
        return [
            Section(item, self.file, f"{self.key_path(key)}[{i}]", self.problems)
            for i, item in enumerate(value)
        ]

    def accept(self, *keys: str) -> None:
        """Count ``keys`` as read without reading them: settings other
        software writes into a shared file that this one ignores."""
        self._read.update(keys)

    def finish(self) -> None:
        """Report keys nobody asked for (typos, misplaced keys)."""
        for key in self.data:
            if key not in self._read:
                self.problem("is not a known setting here", str(key))
