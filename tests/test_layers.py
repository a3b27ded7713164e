"""The layering rule: a module imports only from its own layer or below (errors → api/data/storage →
trainer/evaluator/operator/pipeline → local/cli), counting imports inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import pitlab

LAYERS = {"errors": -1, "api": 0, "data": 0, "storage": 0, "trainer": 1, "evaluator": 1, "operator": 1, "pipeline": 1, "local": 2, "cli": 2}
ROOT = Path(pitlab.__file__).parent


def _part(module: str) -> str | None:
    """The top-level part of pitlab a dotted module name is in (``pitlab.api.status`` → ``api``)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "pitlab" and len(parts) > 1 else None


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            if node.module == "pitlab":  # from pitlab import storage
                out.update(f"pitlab.{a.name}" for a in node.names)
    return out


def upward_imports() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        own = rel.parts[0].removesuffix(".py")
        if own not in LAYERS:
            continue
        for module in sorted(_imports(path)):
            part = _part(module)
            if part in LAYERS and LAYERS[part] > LAYERS[own]:
                found.append(f"pitlab/{rel.as_posix()} imports {module}")
    return found


def test_no_module_imports_a_layer_above_it() -> None:
    assert upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch) -> None:
    """The check is not vacuous: a module of api/ importing the operator is caught."""
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "x.py").write_text("def f():\n    from pitlab.operator import lifecycle\n")
    (tmp_path / "local.py").write_text("from pitlab import storage\nimport pitlab.cli\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert upward_imports() == ["pitlab/api/x.py imports pitlab.operator"]
