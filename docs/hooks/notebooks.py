"""MkDocs hook: render the tutorial notebooks (``notebooks/*.ipynb``) as pages.

Each notebook becomes ``notebooks/<name>.md``, generated at build time: markdown cells as they
are, code cells as Python blocks. The notebooks are committed without outputs, so the pages
show the code and the explanations (run the notebook for the figures); nothing is executed
here, and no plugin beyond MkDocs itself is needed.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from mkdocs.structure.files import File

NOTEBOOK_FOLDER = "notebooks"


def notebook_markdown(path: Path, repo_url: str | None = None) -> str:
    notebook = nbformat.read(path, as_version=4)
    source = f"`notebooks/{path.name}`"
    parts = [f"!!! note \"Notebook\"\n    This page is the notebook {source}; run it with "
             f"`jupyter lab notebooks/{path.name}` to see the figures.\n"]
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source)
        elif cell.cell_type == "code" and cell.source.strip():
            parts.append(f"```python\n{cell.source}\n```")
    text = "\n\n".join(parts) + "\n"
    # the first heading of the notebook is the page title: keep it first
    lines = text.splitlines()
    heading = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
    if heading is not None:
        title = lines.pop(heading)
        lines.insert(0, title + "\n")
    return "\n".join(lines) + "\n"


def on_files(files, config):
    root = Path(config["config_file_path"]).parent
    for path in sorted((root / NOTEBOOK_FOLDER).glob("*.ipynb")):
        files.append(File.generated(config, f"{NOTEBOOK_FOLDER}/{path.stem}.md",
                                    content=notebook_markdown(path)))
    return files
