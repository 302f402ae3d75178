"""How many ways the code does each job, read from the source (and one import probe).

    python tools/count_jobs.py          # a table
    python tools/count_jobs.py --json   # the same as JSON

Each row counts the places that do one job, and lists them: where a job is done in more
than one place, a fix to its meaning must be repeated in each. The rows:
- memory types: the classes that hold a stream's memory;
- memory field rewrites: `._replace(...)` of a memory's field (one of `InferenceCache`'s)
  outside the memory's own module;
- generation loops: the loops (`while_loop`, `fori_loop`) of the samplers, generation and
  the SavedModel, named by the function around each: the token loop and the prompt feed;
- scoring paths: the code that scores targets through the memory with frozen weights
  (`call_with_cache(..., targets=...)`, or the training forward `stateless_call(...,
  targets=..., training=False)`), the TensorFlow trainer's `Evaluation`, and the task's
  `evaluate` (Keras's test step);
- training steps: the places in `txl_keras/training` that decide what a step does with its
  gradients (a function that computes their global norm and checks finiteness: where they
  are judged and clipped), and the losses of Keras's `fit` step (`compute_loss`);
- optimizer recipes: the optimizers built for training, and the JAX trainer's Adam step
  (`adam_update`);
- from_preset meanings: `from_preset` definitions;
- import-time side effects: library modules (programs' `__main__` and
  `if __name__ == "__main__":` blocks left out) with a call or an `os.environ` write at
  module level, and what `import txl_keras`, `import tf_records` and `import txl_io` load
  and change when run in a fresh process.
"""

import ast
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("txl_keras", "tf_records", "txl_io")
MEMORY_MODULES = ("txl_keras/layers/inference_cache.py", "txl_keras/layers/memory_cache.py")
MEMORY_CLASS_WORDS = ("Cache", "Memory", "Store")


def library_files():
    for package in PACKAGES:
        for folder, _, names in os.walk(os.path.join(ROOT, package)):
            for name in sorted(names):
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(folder, name), ROOT)


def _parse(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def _calls(tree, attribute):
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == attribute]


def memory_fields():
    """The field names of `InferenceCache` (the memory with frozen weights), read from its class."""
    tree = _parse(MEMORY_MODULES[0])
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "InferenceCache")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}


def field_rewrites(tree, fields):
    """`._replace(...)` calls that set one of `fields`."""
    return [c for c in _calls(tree, "_replace") if any(k.arg in fields for k in c.keywords)]


def _functions(tree):
    """`(qualified name, node)` of every function, methods as Class.method."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, child
                yield from walk(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, prefix + child.name + ".")
            else:
                yield from walk(child, prefix)
    yield from walk(tree, "")


def _enclosing(tree, node):
    """The qualified name of the innermost function around `node`."""
    around = [(f.end_lineno - f.lineno, name) for name, f in _functions(tree)
              if f.lineno <= node.lineno <= f.end_lineno]
    return min(around)[1] if around else str(node.lineno)


def scoring_calls(tree):
    """Calls that score targets through the memory with frozen weights: `call_with_cache(...,
    targets=...)`, and the training forward (`stateless_call`) given targets and `training=False`."""
    def keyword(call, name):
        return next((k.value for k in call.keywords if k.arg == name), None)

    frozen = [c for c in _calls(tree, "stateless_call") if keyword(c, "targets") is not None
              and isinstance(keyword(c, "training"), ast.Constant) and keyword(c, "training").value is False]
    return [c for c in _calls(tree, "call_with_cache") if keyword(c, "targets") is not None] + frozen


def judges_gradients(function):
    """Whether `function` computes the gradients' global norm (`global_norm(...)`, or `sqrt`
    of a sum of squares) and checks a value is finite: the part of a training step that
    decides what its gradients do."""
    norm = _calls(function, "global_norm") or _calls(function, "clip_by_global_norm") or \
        any("square" in ast.unparse(call) for call in _calls(function, "sqrt"))
    return bool(norm and (_calls(function, "isfinite") or _calls(function, "is_finite")))


def _is_main_guard(node):
    return isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and \
        isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"


def module_level_effects(tree):
    """Line numbers of module-level calls and `os.environ` writes (outside a main guard)."""
    found = []
    for node in tree.body:
        if _is_main_guard(node):
            continue
        statements = [node] + (list(ast.walk(node)) if isinstance(node, (ast.If, ast.Try, ast.With)) else [])
        for statement in statements:
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
                found.append(statement.lineno)
            elif isinstance(statement, (ast.Assign, ast.AugAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                if any("os.environ" in ast.unparse(t) for t in targets):
                    found.append(statement.lineno)
    return sorted(set(found))


IMPORT_PROBE = """
import json, os, sys
environment, stderr = dict(os.environ), os.fstat(2)
import {package}
print(json.dumps({{"loaded": sorted(m for m in ("keras", "tensorflow", "jax", "torch") if m in sys.modules),
                  "environment_changed": sorted(k for k in set(os.environ) | set(environment)
                                                if os.environ.get(k) != environment.get(k)),
                  "stderr_replaced": os.fstat(2) != stderr}}))
"""


def import_probe(package):
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", IMPORT_PROBE.format(package=package)], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=300)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def count():
    rows = {name: [] for name in ("memory types", "memory field rewrites", "generation loops", "scoring paths",
                                  "training steps", "optimizer recipes", "from_preset meanings",
                                  "import-time side effects")}
    fields = memory_fields()
    for path in library_files():
        tree = _parse(path)
        is_program = path.endswith("__main__.py")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(w in node.name for w in MEMORY_CLASS_WORDS) \
                    and path.startswith("txl_keras/layers/"):
                rows["memory types"].append(f"{path}:{node.name}")
        if path not in MEMORY_MODULES:
            rows["memory field rewrites"] += [f"{path}:{c.lineno}" for c in field_rewrites(tree, fields)]
        rows["scoring paths"] += [f"{path}:{node.name}" for node in ast.walk(tree)
                                  if isinstance(node, ast.ClassDef) and node.name == "Evaluation"]
        if not is_program and not path.startswith(("txl_keras/models/", "txl_keras/layers/")):
            rows["scoring paths"] += [f"{path}:{c.lineno}" for c in scoring_calls(tree)]
        if path.startswith(("txl_keras/generate/", "txl_keras/export/", "txl_keras/samplers.py")):
            rows["generation loops"] += [f"{path}:{_enclosing(tree, c)}" for c in
                                         _calls(tree, "while_loop") + _calls(tree, "fori_loop")]
        for name, node in _functions(tree):
            short = name.rsplit(".", 1)[-1]
            if name.endswith("CausalLM.evaluate"):
                rows["scoring paths"].append(f"{path}:{name}")
            if short == "compute_loss" or (path.startswith("txl_keras/training/") and judges_gradients(node)):
                rows["training steps"].append(f"{path}:{name}")
            if short == "from_preset":
                rows["from_preset meanings"].append(f"{path}:{name}")
        rows["optimizer recipes"] += [f"{path}:{c.lineno}" for c in _calls(tree, "Adam") + _calls(tree, "AdamW")
                                      + _calls(tree, "adam_update")]
        if not is_program:
            rows["import-time side effects"] += [f"{path}:{line}" for line in module_level_effects(tree)]
    probes = {package: import_probe(package) for package in PACKAGES}
    for package, probe in probes.items():
        if probe.get("loaded") or probe.get("environment_changed") or probe.get("stderr_replaced") or "error" in probe:
            rows["import-time side effects"].append(f"import {package}: {probe}")
    return rows, probes


def main(argv):
    rows, probes = count()
    if "--json" in argv:
        print(json.dumps({"counts": {k: len(v) for k, v in rows.items()}, "places": rows, "imports": probes},
                         indent=1))
        return
    for name, places in rows.items():
        print(f"{name:26s} {len(places):3d}  " + ("; ".join(places) if places else "-"))
    for package, probe in probes.items():
        print(f"import {package:18s} {probe}")


if __name__ == "__main__":
    main(sys.argv[1:])
