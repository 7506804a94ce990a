"""The generated config reference (docs/config-reference.md) against the schema.

`fairshare.config.reference.render_reference()` builds the reference from the pydantic
models; the checked-in copy must be byte-for-byte that output (regenerate it with
`make docs`), and every field of every model must have its row, under its YAML key, in
its model's section.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from fairshare.config import schema
from fairshare.config.reference import render_reference, sections, type_name

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "config-reference.md"
FIX = "regenerate it with `make docs` (python -m fairshare.config.reference)"


def _section_text(doc: str, anchor: str) -> str:
    start = doc.index(f'<a id="{anchor}"></a>')
    end = doc.find('<a id="', start + 1)
    return doc[start : end if end != -1 else len(doc)]


def test_checked_in_reference_matches_the_schema() -> None:
    assert REFERENCE.is_file(), f"{REFERENCE.relative_to(ROOT)} is missing: {FIX}"
    if REFERENCE.read_text(encoding="utf-8") != render_reference():
        pytest.fail(f"{REFERENCE.relative_to(ROOT)} is out of date with the schema: {FIX}")


def test_module_entry_point_prints_the_reference() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fairshare.config.reference"],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    assert proc.stdout == render_reference()


def _all_models() -> set[type[BaseModel]]:
    """Every model class reachable from FairShareConfig, found independently of reference."""
    found: set[type[BaseModel]] = set()
    todo: list[object] = [schema.FairShareConfig]
    while todo:
        item = todo.pop()
        if isinstance(item, type) and issubclass(item, BaseModel):
            if item not in found:
                found.add(item)
                todo.extend(info.annotation for info in item.model_fields.values())
        else:
            todo.extend(getattr(item, "__args__", ()))
    return found


def test_every_model_has_a_section() -> None:
    listed = {s.model for s in sections()}
    assert listed == _all_models()
    doc = REFERENCE.read_text(encoding="utf-8")
    for section in sections():
        assert f'<a id="{section.anchor}"></a>' in doc, section.model.__name__
        assert f"## `{section.path}`: {section.model.__name__}" in doc


def test_every_field_appears_with_its_yaml_key_and_description() -> None:
    doc = REFERENCE.read_text(encoding="utf-8")
    missing: list[str] = []
    for section in sections():
        text = _section_text(doc, section.anchor)
        rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([^`]+)` \|.*$", text, re.M)}
        for name, info in section.model.model_fields.items():
            key = info.alias or name
            row = rows.get(key)
            if row is None:
                missing.append(f"{section.model.__name__}.{name} (key {key})")
                continue
            first_words = " ".join((info.description or "").split()[:3])
            assert info.description, f"{section.model.__name__}.{name} has no docstring"
            assert first_words.replace("<", "&lt;").replace(">", "&gt;") in row, row
    assert not missing, f"fields without a row: {missing}"


def test_yaml_keys_are_camel_case_aliases() -> None:
    doc = REFERENCE.read_text(encoding="utf-8")
    for key in ("defaultTenant", "gpuSharing", "namespaceSelector", "maxPodsPerGpu"):
        assert f"| `{key}` |" in doc
    assert "| `default_tenant` |" not in doc


def test_types_and_defaults_are_spelled_for_users() -> None:
    doc = render_reference()
    tenant = _section_text(doc, "model-tenant")
    assert "| `name` | DNS-1123 label | required |" in tenant
    assert "| `weight` | number > 0 | `1.0` |" in tenant
    assert "| `limit` | map of string to quantity, optional | unset |" in tenant
    policy = _section_text(doc, "model-defaulttenantpolicy")
    assert '"tenant" or "deny-gpu" or "allow"' in policy
    assert type_name(tuple[str, ...]) == "list of string"
    assert type_name(dict[str, int] | None) == "map of string to integer, optional"


def test_reference_ends_with_the_default_document() -> None:
    doc = render_reference()
    assert doc.endswith("```\n")
    assert "kind: FairShareConfig" in doc.split("## Defaults as YAML", 1)[1]


def test_a_changed_docstring_changes_the_reference() -> None:
    """The drift test has teeth: the text follows the field docstrings and aliases."""

    class Inner(schema._Model):
        """Inner things."""

        some_limit: schema.Quantity = "1Gi"
        """How much of it | at most."""

    class Outer(schema._Model):
        """Outer things."""

        inner_items: tuple[Inner, ...] = ()
        """The items."""

    doc = render_reference(Outer)
    assert "## `innerItems[]`: Inner" in doc
    assert '| `someLimit` | quantity | `"1Gi"` | How much of it \\| at most. |' in doc

    class Changed(schema._Model):
        """Outer things."""

        inner_items: tuple[Inner, ...] = ()
        """The items, renamed."""

    assert render_reference(Changed).replace("Changed", "Outer") != doc
