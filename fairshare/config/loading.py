"""Config text -> ``FairShareConfig``, or a ``ConfigError`` listing every problem by path.

``parse_config`` accepts YAML or JSON (the ConfigMap key ``config.yaml``); errors name
paths in the document's own keys (``tenants[2].weight: must be > 0``). Duplicate keys and
alias bombs are refused, and a document must name its ``apiVersion`` and ``kind``.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from fairshare.config.schema import (
    API_VERSION,
    CONSISTENCY_ERROR,
    KIND,
    FairShareConfig,
    ResourceSpec,
    Tenant,
)
from fairshare.errors import ConfigError, FieldError

__all__ = [
    "LAST_GOOD_SUFFIX",
    "ROOT_PATH",
    "config_from_mapping",
    "dump_config",
    "dump_default_config",
    "field_errors",
    "format_path",
    "load_config_file",
    "parse_config",
]

ROOT_PATH: Final = "(root)"
"""The path of problems that concern the whole document (syntax, top-level type)."""

_MAX_NODES: Final = 100_000  # far above any real config; stops YAML alias expansion bombs
_REQUIRED: Final = (("apiVersion", API_VERSION), ("kind", KIND))
_ITEM_MODELS: Final[dict[str, type[BaseModel]]] = {"resources": ResourceSpec, "tenants": Tenant}


def parse_config(text: str) -> FairShareConfig:
    """Parse and validate a YAML or JSON document. Raises ``ConfigError``."""
    return _validate(_load_document(text))


def load_config_file(path: str | os.PathLike[str]) -> FairShareConfig:
    """Read and validate a config file. Unreadable files also raise ``ConfigError``."""
    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([FieldError(ROOT_PATH, f"cannot read {os.fspath(path)}: {exc}")]) from exc
    return parse_config(text)


def config_from_mapping(obj: Mapping[str, Any]) -> FairShareConfig:
    """Validate an already-decoded document (e.g. from JSON). Raises ``ConfigError``."""
    return _validate(obj)


def _validate(obj: object) -> FairShareConfig:
    if not isinstance(obj, Mapping):
        kind = "empty document" if obj is None else type(obj).__name__
        raise ConfigError([FieldError(ROOT_PATH, f"must be a mapping, got {kind}")])
    errors = [
        FieldError(key, f'required field is missing (use "{value}")')
        for key, value in _REQUIRED
        if key not in obj
    ]
    try:
        config = FairShareConfig.model_validate(dict(obj))
    except ValidationError as exc:
        errors.extend(field_errors(exc))
    if errors:
        raise ConfigError(errors)
    return config


def field_errors(exc: ValidationError) -> list[FieldError]:
    """Translate a pydantic ``ValidationError`` on ``FairShareConfig`` into field errors."""
    result: list[FieldError] = []
    for error in exc.errors(include_url=False):
        if error["type"] == CONSISTENCY_ERROR:
            ctx = error.get("ctx", {})
            result.extend(FieldError(path, message) for path, message in ctx["errors"])
        else:
            result.append(FieldError(format_path(error["loc"]), _message(error)))
    return result


def format_path(loc: Sequence[int | str]) -> str:
    """``("tenants", 2, "weight")`` -> ``tenants[2].weight``; ``()`` -> ``(root)``.

    pydantic's ``[key]`` marker (a bad mapping key) is dropped: the path ends at the key.
    """
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part != "[key]":
            path += f".{part}" if path else part
    return path or ROOT_PATH


def _message(error: ErrorDetails) -> str:
    if error["type"] == "missing":
        return "required field is missing"
    if error["type"] == "extra_forbidden":
        return "unknown field"
    if error["type"] in ("list_type", "tuple_type"):
        return "must be a list"
    if error["type"] == "dict_type":
        got = error.get("input")
        kind = {list: "a list", str: "a string", int: "a number", float: "a number"}.get(
            type(got), ""
        )
        return f"must be a mapping, got {kind}" if kind else "must be a mapping"
    message = error["msg"].removeprefix("Value error, ")
    if message.startswith("Input should be "):
        return "must be " + message.removeprefix("Input should be ")
    return message


# --- YAML ------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[object] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # "<<: *base" keys are overridden on purpose
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str | int | float | bool):
            continue  # unhashable keys are refused by construct_mapping itself
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _load_document(text: str) -> object:
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError:
            pass  # YAML flow style, or broken: the YAML parser reports where
    try:
        document = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "syntax error"
        if exc.context and problem.startswith("but "):  # "expected X, but found Y"
            problem = f"{exc.context}, {problem}"
        raise ConfigError([FieldError(ROOT_PATH, f"invalid YAML{where}: {problem}")]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([FieldError(ROOT_PATH, f"invalid YAML: {exc}")]) from exc
    if _count_nodes(document) > _MAX_NODES:
        raise ConfigError([FieldError(ROOT_PATH, "document too large (alias expansion?)")])
    return document


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ConfigError([FieldError(ROOT_PATH, f"invalid JSON: duplicate key {key!r}")])
        result[key] = value
    return result


def _count_nodes(document: object) -> int:
    """Nodes in the document with aliases expanded, counting stops just past the limit."""
    count, stack = 0, [document]
    while stack and count <= _MAX_NODES:
        item = stack.pop()
        count += 1
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


# --- the commented default document --------------------------------------------------------

_HEADER: Final = """\
# fairshare configuration: ConfigMap fairshare-system/fairshare-config, key config.yaml.
# Generated by fairshare.config.loading.dump_default_config(); values shown are defaults.
# Quantities use Kubernetes syntax ("500m", "64Gi", "0.5"); fractions may be "1/7".
"""

_EXAMPLE_TENANTS: Final = (
    {
        "name": "team-a",
        "namespaces": ["team-a-dev", "team-a-prod"],
        "weight": 2,
        "guaranteed": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"},
        "limit": {"nvidia.com/gpu": "16"},
    },
    {"name": "research", "namespaceSelector": {"example.com/team": "research"}},
)


def dump_config(config: FairShareConfig) -> str:
    """``config`` as plain YAML (what differs from the defaults, plus ``apiVersion`` and
    ``kind``); ``parse_config(dump_config(c)) == c``. The servers record the config in
    force this way (``LAST_GOOD_SUFFIX``)."""
    body = config.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    head = {"apiVersion": config.api_version, "kind": config.kind}
    return yaml.safe_dump({**head, **body}, sort_keys=False)


LAST_GOOD_SUFFIX: Final = "-last-good"
"""The ConfigMap ``<config name>-last-good`` (same namespace) holds the config the servers
run with, written by the extender's leader (key ``config.yaml``): ``fairshare status`` and
``explain`` fall back to it when the config ConfigMap holds an invalid config."""


def dump_default_config(*, example_tenants: bool = False) -> str:
    """The default config as commented YAML (docs, the shipped ConfigMap).

    Every field appears with its docstring as a comment. ``tenants`` is empty unless
    ``example_tenants``; otherwise two example tenants follow, commented out.
    ``parse_config(dump_default_config())`` equals ``FairShareConfig()``.
    """
    examples = FairShareConfig.model_validate({"tenants": _EXAMPLE_TENANTS})
    config = examples if example_tenants else FairShareConfig()
    lines = list(_emit_model(config, indent=0))
    if not example_tenants:
        at = lines.index("tenants: []") + 1
        block = _emit_value("tenants", examples, "tenants", indent=0)
        lines[at:at] = ["# Example:", *(f"# {line}".rstrip() for line in block)]
    return _HEADER + "\n".join(lines) + "\n"


def _emit_model(model: BaseModel, *, indent: int) -> Iterator[str]:
    pad = " " * indent
    for name, info in type(model).model_fields.items():
        key = info.alias or name
        if indent == 0:
            yield ""
        yield from _comment(info.description, indent)
        if name in _ITEM_MODELS:
            yield f"{pad}# Each entry has:"
            for item_name, item in _ITEM_MODELS[name].model_fields.items():
                text = f"{item.alias or item_name}: {item.description}"
                yield from _comment(text, indent, first="- ", rest="  ")
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield f"{pad}{key}:"
            yield from _emit_model(value, indent=indent + 2)
        elif value is None and info.examples:
            yield f"{pad}# Example:"
            yield from (f"{pad}# {line}" for line in _yaml({key: info.examples[0]}))
        else:
            yield from _emit_value(name, model, key, indent=indent)


def _emit_value(name: str, model: BaseModel, key: str, *, indent: int) -> list[str]:
    value = getattr(model, name)
    if isinstance(value, tuple) and value and isinstance(value[0], BaseModel):
        # Lists of models (tenants) show only what differs from the defaults.
        data: object = [item.model_dump(mode="json", exclude_defaults=True) for item in value]
    else:
        data = model.model_dump(mode="json", include={name})[key]
    return [" " * indent + line for line in _yaml({key: data})]


def _comment(text: str | None, indent: int, first: str = "", rest: str = "") -> Iterator[str]:
    width = 88 - indent
    for line in textwrap.wrap(text or "", width, initial_indent=first, subsequent_indent=rest):
        yield f"{' ' * indent}# {line}"


def _yaml(data: object) -> list[str]:
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=88)
    return text.splitlines()
