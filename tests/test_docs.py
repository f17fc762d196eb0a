"""The README stays short and is the index of docs/; no relative link of the README or of
docs/ is broken; the Python examples they show are the scripts that other tests run."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs").glob("*/*.md"))
# Programs whose text a page shows and a test runs (tests/examples/): test_agent_example.py runs
# the first, test_reinforce_example.py trains with the second, test_dqn_example.py runs the
# third.
TESTED_SCRIPTS = [ROOT / "examples" / "agent_cartpole.py", ROOT / "examples" / "reinforce.py",
                  ROOT / "examples" / "dqn_logged_data.py"]

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def relative_links(path):
    """The targets of a Markdown file's links and images that are files of this repository,
    resolved against the file's folder, without `#anchor`; code is left out.

    Returns: list of (target as written, resolved pathlib.Path)."""
    text = INLINE_CODE.sub("", FENCE.sub("", path.read_text()))
    links = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # https:, mailto:, an anchor of the same page.
        links.append((target, (path.parent / target.split("#")[0]).resolve()))
    return links


def test_there_are_pages():
    assert len(PAGES) >= 10, PAGES


def test_readme_has_at_most_200_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, len(lines)


def test_readme_links_every_page_of_docs():
    linked = {resolved for _, resolved in relative_links(README)}
    missing = [str(page.relative_to(ROOT)) for page in PAGES if page.resolve() not in linked]
    assert not missing, f"not linked from README.md: {missing}"


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda path: path.name)
def test_relative_links_point_to_files(path):
    broken = [target for target, resolved in relative_links(path) if not resolved.is_file()]
    assert not broken, f"{path.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda path: path.name)
def test_python_examples_are_tested_scripts(path):
    """Every ```python block is the text (whole or a run of whole lines) of a script that a
    test runs, so that the example cannot drift from working code."""
    scripts = [script.read_text() for script in TESTED_SCRIPTS]
    for block in PYTHON_BLOCK.findall(path.read_text()):
        assert any(f"\n{block}" in f"\n{script}" for script in scripts), (
            f"{path.relative_to(ROOT)}: a Python example that is not in "
            f"{[str(script.relative_to(ROOT)) for script in TESTED_SCRIPTS]}:\n{block}")


def test_the_link_finder_sees_links_and_skips_code(tmp_path):
    """The checks above rely on it: links and images count, URLs, anchors and code do not."""
    (tmp_path / "a.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[a](a.md#part) ![img](b.png) [web](https://x.org/c.md) [top](#top)\n"
                    "`[code](d.md)`\n```sh\n[fenced](e.md)\n```\n")
    found = relative_links(page)
    assert found == [("a.md#part", tmp_path / "a.md"), ("b.png", tmp_path / "b.png")]
