"""YAML loading that remembers where every value came from.

Operators fix config by line number, so every validation error must point at a
line. PyYAML's composed node tree carries positions; this turns it into plain
Python data plus a map from each value's path to its line. Duplicate keys,
which YAML silently resolves to the last one, are an error here: a pool defined
twice is almost always a mistake that would otherwise lose half of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[str | int, ...]


class YamlSyntaxError(ValueError):
    def __init__(self, file: str, line: int | None, message: str) -> None:
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {message}")
        self.file = file
        self.line = line
        self.message = message


@dataclass
class SourceMap:
    """Line numbers (1-based) of values by path; ``line_of`` falls back to the nearest enclosing value."""

    file: str
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Path) -> int | None:
        probe = tuple(path)
        while True:
            if probe in self.lines:
                return self.lines[probe]
            if not probe:
                return None
            probe = probe[:-1]


def load_yaml(text: str, file: str) -> tuple[Any, SourceMap]:
    """Parse ``text``; returns the data and its source map. Raises :class:`YamlSyntaxError`."""
    source = SourceMap(file)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise YamlSyntaxError(file, line, f"not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(file, None, f"not valid YAML: {exc}") from None
    if node is None:
        return {}, source
    constructor = yaml.SafeLoader("")
    return _build(node, (), source, constructor), source


def _build(node: yaml.Node, path: Path, source: SourceMap, constructor: yaml.SafeLoader) -> Any:
    source.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        constructor.flatten_mapping(node)  # resolves YAML merge keys (<<)
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = constructor.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool) and key is not None:
                raise YamlSyntaxError(source.file, key_node.start_mark.line + 1, "mapping keys must be scalars")
            path_key: str | int = key if isinstance(key, str | int) and not isinstance(key, bool) else str(key)
            if key in result:
                first = source.lines.get((*path, path_key))
                raise YamlSyntaxError(
                    source.file,
                    key_node.start_mark.line + 1,
                    f"duplicate key {key!r} (first defined on line {first})",
                )
            child_path = (*path, path_key)
            source.lines[child_path] = key_node.start_mark.line + 1
            result[key] = _build(value_node, child_path, source, constructor)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*path, i), source, constructor) for i, item in enumerate(node.value)]
    return constructor.construct_object(node, deep=True)


def as_mapping(data: Any, file: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise YamlSyntaxError(file, 1, f"the top level must be a mapping, not {type(data).__name__}")
    return data
