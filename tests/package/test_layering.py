"""The import rules of the package, read from the source (module level and inside
functions): kernels <- layers <- models <- {tokenizers, samplers} <- run_folder <- {generate,
convert} <- export <- presets <- tasks <- {training, command lines}; tf_records a data
package that knows nothing of the model (its program reads the releases' table of corpora and
vocabularies), and txl_io (storage, fetching, program start) beneath both. Every module is
covered, the programs' `__main__` included."""

import ast
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# package (a prefix of module names) -> prefixes it must never import
_ABOVE_LAYERS = ["txl_keras.models", "txl_keras.training", "txl_keras.export", "txl_keras.generate",
                 "txl_keras.convert", "txl_keras.run_folder", "txl_keras.presets", "txl_keras.tasks",
                 "txl_keras.tokenizers", "txl_keras.releases", "tf_records", "txl_io"]
_TASK_AND_PRESETS = ["txl_keras.presets", "txl_keras.tasks"]
FORBIDDEN = {
    "tf_records": ["txl_keras"],
    "txl_io": ["txl_keras", "tf_records"],
    "txl_keras.kernels": ["txl_keras.layers", "txl_keras.tf_backend"] + _ABOVE_LAYERS,
    "txl_keras.tf_backend": _ABOVE_LAYERS,
    "txl_keras.layers": ["txl_keras.models", "txl_keras.training", "txl_keras.export", "txl_keras.generate",
                         "txl_keras.convert", "txl_keras.run_folder", "tf_records"],
    "txl_keras.models": ["txl_keras.training", "txl_keras.export", "txl_keras.generate", "txl_keras.convert",
                         "txl_keras.run_folder", "txl_keras.tokenizers", "tf_records"] + _TASK_AND_PRESETS,
    "txl_keras.tokenizers": ["txl_keras.models", "txl_keras.training", "txl_keras.export", "txl_keras.generate",
                             "txl_keras.convert", "txl_keras.run_folder"] + _TASK_AND_PRESETS,
    "txl_keras.run_folder": ["txl_keras.training", "txl_keras.export", "txl_keras.generate",
                             "txl_keras.convert"] + _TASK_AND_PRESETS,
    "txl_keras.export": ["txl_keras.training", "txl_keras.convert"] + _TASK_AND_PRESETS,
    "txl_keras.generate": ["txl_keras.training", "txl_keras.export", "txl_keras.convert"] + _TASK_AND_PRESETS,
    "txl_keras.convert": ["txl_keras.training", "txl_keras.export", "txl_keras.generate"] + _TASK_AND_PRESETS,
    "txl_keras.schedules": ["txl_keras.models", "txl_keras.layers", "txl_keras.samplers"] + _ABOVE_LAYERS,
    "txl_keras.optimizers": ["txl_keras.models", "txl_keras.layers", "txl_keras.samplers", "txl_keras.schedules"]
    + _ABOVE_LAYERS,
    "txl_keras.samplers": ["txl_keras.models", "txl_keras.run_folder", "txl_keras.training", "txl_keras.export",
                           "txl_keras.generate", "txl_keras.convert", "tf_records"] + _TASK_AND_PRESETS,
    "txl_keras.presets": ["txl_keras.training", "txl_keras.export", "txl_keras.generate", "txl_keras.tasks"],
    "txl_keras.tasks": ["txl_keras.training", "txl_keras.convert"],
    # The programs sit on top of their package: each may use the task and the presets, none the trainers.
    "txl_keras.generate.__main__": ["txl_keras.training", "txl_keras.export", "txl_keras.convert"],
    "txl_keras.export.__main__": ["txl_keras.training", "txl_keras.convert", "txl_keras.generate"],
    "txl_keras.convert.__main__": ["txl_keras.training", "txl_keras.export", "txl_keras.generate"] + _TASK_AND_PRESETS,
    # `python -m tf_records --pretrained=NAME` reads a release's corpus and vocabulary, which are data.
    "tf_records.__main__": [p for p in _ABOVE_LAYERS if p not in ("txl_keras.releases", "tf_records", "txl_io")]
    + ["txl_keras.layers", "txl_keras.kernels", "txl_keras.tf_backend", "txl_keras.samplers"],
    "txl_keras.hub": ["txl_keras.models", "txl_keras.training", "txl_keras.export", "txl_keras.generate",
                      "txl_keras.convert", "txl_keras.run_folder", "txl_keras.layers", "txl_keras.kernels"]
    + _TASK_AND_PRESETS,
    "txl_keras.releases": ["txl_keras.models", "txl_keras.training", "txl_keras.export", "txl_keras.generate",
                           "txl_keras.convert", "txl_keras.run_folder"] + _TASK_AND_PRESETS,
}


def modules():
    for package in ("txl_keras", "tf_records", "txl_io"):
        for folder, _, names in os.walk(os.path.join(ROOT, package)):
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    yield module[: -len(".__init__")] if module.endswith(".__init__") else module, path


def imported(path, module):
    """Every module name an import statement anywhere in the file names."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def owner(module):
    matches = [p for p in FORBIDDEN if module == p or module.startswith(p + ".")]
    return max(matches, key=len) if matches else None


def test_imports_go_one_way():
    found = list(modules())
    assert len(found) > 30
    violations = []
    for module, path in found:
        rules = owner(module)
        if rules is None:
            continue
        for name in imported(path, module):
            if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[rules]):
                violations.append(f"{module} imports {name}")
    assert not violations, violations


def test_the_checker_sees_imports_inside_functions(tmp_path):
    tree_path = tmp_path / "probe.py"
    tree_path.write_text("def f():\n    from txl_keras.training import cli\n")
    assert "txl_keras.training.cli" in set(imported(str(tree_path), "txl_keras.models.probe"))


PROBE = r"""
import json, sys, pkgutil, importlib
import tensorflow as tf
from absl import flags
keras_before = {m for m in sys.modules if m.split(".")[0] == "keras"}
flags_before = set(flags.FLAGS)
import tf_records
import txl_io.files, tf_records.download
data = {"keras": sorted({m for m in sys.modules if m.split(".")[0] == "keras"} - keras_before),
        "txl": sorted(m for m in sys.modules if m.startswith("txl_keras"))}
import txl_keras
for info in pkgutil.walk_packages(txl_keras.__path__, "txl_keras."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
data["flags"] = sorted(set(flags.FLAGS) - flags_before)
data["lazy"] = [callable(txl_keras.export_saved_model), callable(txl_keras.generate.generate),
                callable(txl_keras.convert.from_tf_checkpoint)]
print(json.dumps(data))
"""


def test_tf_records_loads_no_keras_and_the_library_defines_no_flags():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["keras"] == [] and data["txl"] == [], data
    assert data["flags"] == [], data["flags"]
    assert data["lazy"] == [True, True, True]
