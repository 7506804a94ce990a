"""The documentation site (mkdocs.yml, pages under docs/) and the README's links into it.

`make docs-check` (run by `make test`) builds the site with `mkdocs build --strict`, which
refuses broken links and anchors between pages, pages missing from the nav and nav entries
without a page. These tests say the same of the nav without mkdocs, and check what the
build does not see: the README's relative links (the README is not a page of the site).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _nav_pages(entries: object) -> list[str]:
    """Every page path named in a mkdocs nav (nested sections included)."""
    found: list[str] = []
    if isinstance(entries, str):
        found.append(entries)
    elif isinstance(entries, list):
        for entry in entries:
            found.extend(_nav_pages(entry))
    elif isinstance(entries, dict):
        for value in entries.values():
            found.extend(_nav_pages(value))
    return found


def _config() -> dict[str, object]:
    loaded = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def test_every_nav_entry_is_a_page_and_every_page_is_in_the_nav() -> None:
    config = _config()
    assert config.get("docs_dir", "docs") == "docs"
    nav = [p for p in _nav_pages(config["nav"]) if "://" not in p]
    assert len(nav) == len(set(nav)), f"pages listed twice in the nav: {nav}"
    missing = [p for p in nav if not (DOCS / p).is_file()]
    assert not missing, f"nav entries without a page under docs/: {missing}"
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    unlisted = [p for p in pages if p not in nav]
    assert not unlisted, f"pages under docs/ missing from mkdocs.yml's nav: {unlisted}"


def test_the_build_is_strict_about_links_and_the_nav() -> None:
    config = _config()
    assert config.get("strict") is True
    validation = config["validation"]
    assert isinstance(validation, dict)
    assert validation["nav"] == {
        "omitted_files": "warn",
        "not_found": "warn",
        "absolute_links": "warn",
    }
    assert validation["links"]["not_found"] == "warn"
    assert validation["links"]["anchors"] == "warn"


def test_the_site_is_built_into_an_ignored_directory() -> None:
    config = _config()
    site = config.get("site_dir", "site")
    assert f"/{site}/" in (ROOT / ".gitignore").read_text(encoding="utf-8").split()


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_links_reach_existing_files() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t for t in _LINK.findall(readme) if "://" not in t and not t.startswith("#")]
    assert targets, "the README links to no docs page"
    broken = [t for t in targets if not (ROOT / t.split("#", 1)[0]).exists()]
    assert not broken, f"README links to missing files: {broken}"


def test_readme_links_every_docs_page_and_install_first() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {t.split("#", 1)[0] for t in _LINK.findall(readme)}
    pages = {f"docs/{p}" for p in _nav_pages(_config()["nav"])}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"
    assert "[Install on a cluster](docs/install.md)" in readme
    assert len(readme.splitlines()) <= 300
