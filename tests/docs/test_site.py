"""The site as ``make docs`` builds it: the strict build passes, every internal link and
asset of every page resolves to a built file (and to its anchor when it names one), and
nothing is fetched from the network to show a page or to search it."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.docs.site import build, read_page

pytestmark = pytest.mark.slow


def _target(site: Path, page: Path, url: str) -> tuple[Path, str]:
    """The built file and the anchor an internal ``url`` of ``page`` points at."""
    parts = urlsplit(url)
    path = unquote(parts.path)
    # 404.html, served at any depth, links from the root (site_url unset: "/")
    base = site.resolve() if path.startswith("/") else page.parent
    target = page if not path else (base / path.lstrip("/")).resolve()
    if path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target, unquote(parts.fragment)


def broken_links(site: Path) -> list[str]:
    """Every internal href/src of the built ``site`` that does not resolve, as
    ``page: url (why)``."""
    pages = {path.resolve(): read_page(path) for path in site.rglob("*.html")}
    broken = []
    for page, links in pages.items():
        for _, _, url in links.urls:
            parts = urlsplit(url)
            if parts.scheme or url.startswith("//"):
                continue  # external: see test_nothing_is_fetched_from_the_network
            target, anchor = _target(site, page, url)
            where = f"{page.relative_to(site.resolve())}: {url}"
            if not target.is_relative_to(site.resolve()):
                broken.append(f"{where} (outside the site)")
            elif not target.is_file():
                broken.append(f"{where} (no file {target.relative_to(site.resolve())})")
            elif anchor and target.suffix == ".html" and anchor not in pages[target].ids:
                broken.append(f"{where} (no anchor #{anchor})")
    return broken


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    done = build(site)
    assert done.returncode == 0, done.stderr[-4000:]
    return site


@pytest.mark.timeout(600)
def test_every_internal_link_of_the_built_site_resolves(site: Path) -> None:
    assert len(list(site.rglob("*.html"))) >= 90
    assert broken_links(site) == []


def test_the_link_check_finds_a_missing_page_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a/index.html").write_text('<h2 id="here">x</h2><a href="#here">ok</a>')
    (tmp_path / "index.html").write_text(
        '<a href="a/">ok</a><a href="a/#here">ok</a><a href="a/#gone">no</a>'
        '<a href="b/">no</a><img src="pic.png"><a href="https://example.com/">out</a>'
        '<a href="/a/#here">ok</a><a href="../up/">no</a>'
    )
    assert broken_links(tmp_path) == [
        "index.html: a/#gone (no anchor #gone)",
        "index.html: b/ (no file b/index.html)",
        "index.html: pic.png (no file pic.png)",
        "index.html: ../up/ (outside the site)",
    ]


def test_nothing_is_fetched_from_the_network(site: Path) -> None:
    fetched = []
    for path in site.rglob("*.html"):
        for tag, rel, url in read_page(path).urls:
            loads = tag in ("script", "img", "iframe") or (
                tag == "link" and any(r in rel for r in ("stylesheet", "preconnect", "preload"))
            )
            if loads and (urlsplit(url).scheme or url.startswith("//")):
                fetched.append(f"{path.relative_to(site)}: <{tag}> {url}")
    assert fetched == []
    assert "fonts.googleapis" not in (site / "index.html").read_text("utf-8")


def test_search_has_a_local_index_of_every_page_and_the_generated_ones(site: Path) -> None:
    index = json.loads((site / "search/search_index.json").read_text("utf-8"))
    locations = {doc["location"].split("#")[0] for doc in index["docs"]}
    assert {"configuration/", "cli/", "errors/", "reference/mcp/"} <= locations
    text = " ".join(doc["text"] for doc in index["docs"])
    assert "CONVOQ_REDIS_URL" in text and "ModelHTTPError" in text
