"""Every relative link of README.md and docs/**/*.md points to a file of the checkout, and a `#anchor` on a
markdown page to one of its headings, so a moved page or record cannot leave a dead link behind."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from .helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target), images included
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for title in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower().replace("`", "")).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(FENCE.sub("", page.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not checked


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_points_to_a_file_and_heading_of_the_checkout(page):
    dead = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            dead.append(f"{target} (no file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            dead.append(f"{target} (no heading #{anchor})")
    assert not dead, f"{page.relative_to(REPO)}: dead links:\n" + "\n".join(dead)


def test_the_link_checker_sees_the_pages_and_their_links():
    assert REPO / "README.md" in PAGES and REPO / "docs" / "results.md" in PAGES
    assert any(links(page) for page in PAGES)
