"""The docs against the code they describe, so that they cannot drift apart unseen (a review
of session 40 found nine stale statements, none of which a test read): every relative link
and anchor resolves, every environment switch the code reads is documented, every test id
and `python -m jax_flashoverlap.X` command the docs name exists. Each checker is also shown
a broken document, so none of these tests can pass by reading nothing."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# what users and developers read: the README, docs/, and every results folder's README
# (hidden folders skipped too: .venv, .pytest_cache, .build and the like)
SKIP_DIRS = {"build", "tmp_device", "node_modules", "__pycache__"}


def markdown_files(root=ROOT):
  def skipped(folder):
    return folder in SKIP_DIRS or folder.startswith(".") or folder.endswith(".egg-info")
  return sorted(p for p in root.rglob("*.md")
                if not any(skipped(f) for f in p.relative_to(root).parts[:-1]))


def heading_anchor(heading: str) -> str:
  """GitHub's anchor of a Markdown heading: lower case, punctuation but '-' and '_' dropped,
  spaces to '-'."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(doc: Path) -> list:
  """(link, why) for each relative link of `doc` whose file is missing or whose #anchor is no
  heading of the Markdown file it names (code blocks skipped: their brackets are code)."""
  text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
  broken = []
  for link in re.findall(r"\]\(([^)\s]+)\)", text):
    if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
      continue
    path, _, anchor = link.partition("#")
    target = (doc.parent / path) if path else doc
    if not target.exists():
      broken.append((link, "no such file"))
    elif anchor and target.suffix == ".md":
      headings = re.findall(r"^#+ (.*)$", target.read_text(), re.M)
      if anchor not in {heading_anchor(h) for h in headings}:
        broken.append((link, "no such heading"))
  return broken


SWITCH = r"\b((?:JAX_)?FLASHOVERLAP_[A-Z0-9_]*[A-Z0-9])\b"


def switches_read(root=ROOT) -> dict:
  """{name: first file} of every JAX_FLASHOVERLAP_* / FLASHOVERLAP_* name in the package,
  scripts, examples, benchmarks and setup.py (Python and shell: any mention), and in the C++
  as a string literal (its macros share the prefix and are no switches)."""
  found = {}
  python_and_shell = [*root.glob("jax_flashoverlap/*.py"), *root.glob("scripts/*"),
                      *root.glob("examples/*.py"), *root.glob("benchmarks/*.py"),
                      *root.glob("benchmarks/*.sh"), *root.glob("tests/cuda/*.sh"),
                      root / "setup.py"]
  for path in python_and_shell:
    if path.is_file():
      for name in re.findall(SWITCH, path.read_text()):
        found.setdefault(name, path)
  for path in sorted(root.glob("xla_ffi/**/*")):
    if path.suffix in (".cc", ".cu", ".h"):
      for name in re.findall(r'"' + SWITCH, path.read_text()):
        found.setdefault(name, path)
  return found


def documented_text(root=ROOT) -> str:
  return "\n".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))])


def missing_test_ids(doc: Path, root=ROOT) -> list:
  """Each `tests/FILE.py::NAME` the doc cites (or `FILE.py::NAME`, under tests/) whose file
  has no `def NAME` / `class NAME`."""
  missing = []
  cited = re.findall(r"(?<![\w/])((?:tests/)?[\w/]*test_\w+\.py)::(\w+)", doc.read_text())
  for file, name in set(cited):
    file = file if file.startswith("tests/") else "tests/" + file
    path = root / file
    if not path.exists() or not re.search(rf"^\s*(def|class) {name}\b", path.read_text(), re.M):
      missing.append(f"{file}::{name}")
  return sorted(missing)


def missing_modules(doc: Path, root=ROOT) -> list:
  """Each `python -m jax_flashoverlap.MOD` the doc shows whose module has no __main__ entry."""
  missing = []
  for mod in sorted(set(re.findall(r"python3? -m jax_flashoverlap\.(\w+)", doc.read_text()))):
    path = root / "jax_flashoverlap" / f"{mod}.py"
    if not path.exists() or '__name__ == "__main__"' not in path.read_text():
      missing.append(mod)
  return missing


def unknown_case_ids(table_doc: Path, root=ROOT) -> list:
  """docs/errors.md's rows name their test case in the last column but one: `ID` (a case id of
  the tests, quoted there), `-SUFFIX` (the id before it with another end), `...[ID]` (a
  parametrized test's id), a test file `FILE.py` or a `FILE.py::NAME` (missing_test_ids reads
  those). Each ID no test file quotes, each FILE.py not under tests/."""
  tests = "\n".join(p.read_text() for p in sorted((root / "tests").glob("*.py")))
  unknown = []
  for line in table_doc.read_text().splitlines():
    cells = line.strip().strip("|").split(" | ")
    if not line.startswith("|") or len(cells) < 3 or set(cells[0].strip()) <= {"-", " "}:
      continue
    for case in re.findall(r"`([^`]+)`", cells[-2]):
      if "::" in case:
        continue
      if case.endswith(".py"):  # a whole test file
        if not (root / "tests" / case).exists():
          unknown.append(case)
        continue
      if case.startswith("...["):
        quoted = re.escape(case[4:].rstrip("]"))
      elif case.startswith("-"):
        quoted = r"[\w-]+" + re.escape(case)
      else:
        quoted = re.escape(case)
      if not re.search(rf"[\"']{quoted}[\"']", tests):
        unknown.append(case)
  return unknown


DOCS = markdown_files()


def test_the_docs_are_found():
  names = {p.relative_to(ROOT).as_posix() for p in DOCS}
  assert {"README.md", "docs/DESIGN.md", "docs/errors.md", "benchmarks/results/README.md"} <= names
  assert len(DOCS) > 20, names  # the results folders' READMEs too


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(doc):
  assert broken_links(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_cited_test_and_module_exists(doc):
  assert missing_test_ids(doc) == []
  assert missing_modules(doc) == []


def test_every_bad_input_row_names_a_case_the_tests_have():
  doc = ROOT / "docs" / "errors.md"
  assert len(re.findall(r"^\|.*\| `[a-z0-9]+-[a-z0-9-]+` \|", doc.read_text(), re.M)) > 100
  assert unknown_case_ids(doc) == []


def test_every_switch_the_code_reads_is_documented():
  found = switches_read()
  # the premise: the reader sees switches of every layer (Python, C++ kernel, C++ comm, shell)
  for name in ("JAX_FLASHOVERLAP_FALLBACK", "FLASHOVERLAP_GEMM_EPILOGUE", "JAX_FLASHOVERLAP_WAIT",
               "JAX_FLASHOVERLAP_TEST_WORKERS"):
    assert name in found, name
  assert "FLASHOVERLAP_FFI_HANDLERS" not in found  # a C++ macro, no switch
  text = documented_text()
  undocumented = {name: str(path.relative_to(ROOT)) for name, path in found.items()
                  if name not in text}
  assert undocumented == {}, "documented nowhere in README.md or docs/"


def test_the_checkers_see_what_is_broken(tmp_path):
  """A document and a tree with one of each fault: every checker reports it."""
  (tmp_path / "docs").mkdir()
  (tmp_path / "jax_flashoverlap").mkdir()
  (tmp_path / "tests").mkdir()
  (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## A section (2026)\n")
  (tmp_path / "tests" / "test_a.py").write_text("def test_there():\n  pass\n")
  (tmp_path / "jax_flashoverlap" / "tool.py").write_text('if __name__ == "__main__":\n  pass\n')
  (tmp_path / "jax_flashoverlap" / "lib.py").write_text("X = 1\n")
  (tmp_path / "jax_flashoverlap" / "ops.py").write_text(
      'import os\nos.environ.get("JAX_FLASHOVERLAP_NEW_SWITCH")\n')
  doc = tmp_path / "README.md"
  doc.write_text(
      "[ok](docs/other.md#a-section-2026) [gone](docs/gone.md) [bad](docs/other.md#nope)\n"
      "[self](#title) `tests/test_a.py::test_there` `tests/test_a.py::test_gone`\n"
      "`test_a.py::test_there` `test_b.py::test_any`\n"
      "`python -m jax_flashoverlap.tool` `python -m jax_flashoverlap.lib`\n"
      "```\n[code](not/a/link.md)\n```\n")
  assert broken_links(doc) == [("docs/gone.md", "no such file"),
                               ("docs/other.md#nope", "no such heading"),
                               ("#title", "no such heading")]
  assert missing_test_ids(doc, tmp_path) == ["tests/test_a.py::test_gone",
                                             "tests/test_b.py::test_any"]
  assert missing_modules(doc, tmp_path) == ["lib"]
  (tmp_path / "tests" / "_cases.py").write_text('CASES = [case("op-bad-dtype"), case("op-bad-rank")]\n'
                                                'BAD = {"gpu_blank": 1}\n')
  table = tmp_path / "docs" / "errors.md"
  table.write_text("| input | error | test id | result |\n| --- | --- | --- | --- |\n"
                   "| a | `ValueError` | `op-bad-dtype`, `-rank` | pass |\n"
                   "| b | `ValueError` | `op-gone`, `-shape` | pass |\n"
                   "| c | `ValueError` | `...[gpu_blank]`, `...[gpu_gone]` | pass |\n"
                   "| d | `ValueError` | `test_a.py::test_there` | pass |\n"
                   "| e | 2 | `test_a.py`, `test_c.py` | pass |\n")
  assert unknown_case_ids(table, tmp_path) == ["op-gone", "-shape", "...[gpu_gone]", "test_c.py"]
  assert set(switches_read(tmp_path)) == {"JAX_FLASHOVERLAP_NEW_SWITCH"}
  assert "JAX_FLASHOVERLAP_NEW_SWITCH" not in documented_text(tmp_path)
  (tmp_path / ".venv").mkdir()
  (tmp_path / ".venv" / "notes.md").write_text("[gone](gone.md)\n")
  assert markdown_files(tmp_path) == [doc, table, tmp_path / "docs" / "other.md"]
