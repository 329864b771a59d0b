"""Job configs as nested dicts: read a TOML file, write one back, reach a key by its dotted name.

The writer exists because sweeps write configs (tomllib only reads): it covers every value a TOML file can
hold, so reading what it wrote gives the same dict.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, BinaryIO

from recipe.errors import ConfigError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


UTF8_BOM = b"\xef\xbb\xbf"  # what some editors (Windows Notepad) write before UTF-8 text


def load_toml_file(f: BinaryIO) -> dict[str, Any]:
    """The TOML of a file opened in binary mode, a UTF-8 byte-order mark before it accepted (TOML has none, but
    the mark says nothing but "UTF-8"). TOMLDecodeError or UnicodeDecodeError as tomllib raises them."""
    data = f.read()
    return tomllib.loads(data.removeprefix(UTF8_BOM).decode("utf-8"))


def load_toml(path: Path) -> dict[str, Any]:
    """The TOML file at `path` as a dict."""
    with open(path, "rb") as f:
        return load_toml_file(f)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The job config file a user named, as a dict; ConfigError naming it for a file that cannot be read, is not
    UTF-8 or is not TOML."""
    try:
        return load_toml(Path(path))
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path} is not UTF-8 text (byte {err.start}), as TOML must be") from err


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _toml_string(key)


def _toml_string(text: str) -> str:
    # JSON's escapes are valid TOML basic-string escapes; TOML also forbids a raw DEL.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: Any) -> str:
    """`value` as a TOML literal; TypeError for a type TOML cannot hold."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} value {value!r} as TOML")


def dump_toml(config: dict[str, Any], header: str = "") -> str:
    """TOML text for `config`: top-level keys, then one `[section]` (or `[section.sub]`) per table."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]

    def write_table(name: str, table: dict[str, Any]) -> None:
        scalars = [(k, v) for k, v in table.items() if not isinstance(v, dict)]
        tables = [(k, v) for k, v in table.items() if isinstance(v, dict)]
        if name and (scalars or not tables):
            lines.extend(["", f"[{name}]"] if lines else [f"[{name}]"])
        lines.extend(f"{_toml_key(k)} = {toml_value(v)}" for k, v in scalars)
        for key, sub in tables:
            write_table(f"{name}.{_toml_key(key)}" if name else _toml_key(key), sub)

    write_table("", config)
    return "\n".join(lines) + "\n"


def get_key(config: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """The value at `dotted` (e.g. "training.seq_len"), or `default` where a part of the path is missing."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_key(config: dict[str, Any], dotted: str, value: Any) -> None:
    """Set the value at `dotted`, creating the tables on the way; ValueError where a part is not a table."""
    *sections, key = dotted.split(".")
    node = config
    for part in sections:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"cannot set {dotted}: {part} is a value, not a table")
    node[key] = value


def parse_value(text: str) -> Any:
    """A TOML literal (`4`, `2e-3`, `true`, `[0, 1]`, `"x"`), or the text itself as a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
