"""Imports point down only: neuron_eager -> adaptive -> ops -> device_sim (STYLE.md)."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = {"device_sim": 0, "ops": 1, "adaptive": 2, "neuron_eager": 3}
MODULE_LAYER = {"neuron_eager.device_sim": 0, "neuron_eager.ops": 1, "neuron_eager.adaptive": 2}


def _layer_of_import(name: str):
    for prefix, layer in MODULE_LAYER.items():
        if name == prefix or name.startswith(prefix + "."):
            return layer
    if name == "neuron_eager" or name.startswith("neuron_eager."):
        return 3
    return None


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module


def test_imports_point_down():
    bad = []
    for folder, layer in LAYERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            for lineno, name in _imports(path):
                target = _layer_of_import(name)
                if target is not None and target > layer:
                    bad.append(f"{path.relative_to(ROOT)}:{lineno} imports {name}")
    assert not bad, "imports pointing up:\n" + "\n".join(bad)


def test_device_sim_knows_no_torch():
    for path in (ROOT / "device_sim").rglob("*.py"):
        for lineno, name in _imports(path):
            assert name.split(".")[0] not in ("torch", "numba"), \
                f"{path.relative_to(ROOT)}:{lineno} imports {name}"
