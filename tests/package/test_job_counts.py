"""`tools/count_jobs.py`: its detectors see what they look for, and the jobs brought down to
one way stay there (no code outside the memory rewrites its fields; both trainers' steps judge
their gradients in one place; importing a package has no effect on the process)."""

import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import count_jobs  # noqa: E402


def test_module_level_effects_are_found_and_a_main_guard_is_not_one():
    tree = ast.parse("import os\nimport re\nPATTERN = re.compile('x')\nos.environ['A'] = '1'\nsetup()\n"
                     "def f():\n    g()\nif True:\n    h()\nif __name__ == '__main__':\n    main()\n")
    assert count_jobs.module_level_effects(tree) == [4, 5, 9]


def test_a_rewrite_of_a_memory_field_is_found_and_one_of_another_tuple_is_not():
    fields = count_jobs.memory_fields()
    assert {"rings", "offset", "valid"} <= fields
    tree = ast.parse("cache._replace(rings=r)\nstate._replace(step=1)\nx._replace(valid=v, step=2)\n")
    assert [c.lineno for c in count_jobs.field_rewrites(tree, fields)] == [1, 3]


def test_a_step_that_judges_its_gradients_is_found_in_either_trainers_form():
    tree = ast.parse("def tf_step(grads):\n    return tf.math.is_finite(tf.linalg.global_norm(grads))\n"
                     "def jax_step(grads):\n    return ops.isfinite(ops.sqrt(sum(ops.sum(ops.square(g)) for g in grads)))\n"
                     "def a_norm(grads):\n    return ops.sqrt(sum(ops.sum(ops.square(g)) for g in grads))\n"
                     "def layer_norm(x):\n    return x / ops.sqrt(variance)\n")
    judged = [f.name for f in tree.body if count_jobs.judges_gradients(f)]
    assert judged == ["tf_step", "jax_step"]


def test_scoring_through_the_cache_or_the_frozen_training_forward_is_found():
    tree = ast.parse("model.call_with_cache(x, cache, targets=y)\nmodel.call_with_cache(x, cache)\n"
                     "model.stateless_call(w, n, x, targets=y, training=False)\n"
                     "model.stateless_call(w, n, x, targets=y, training=True)\n")
    assert [c.lineno for c in count_jobs.scoring_calls(tree)] == [1, 3]


def test_no_field_rewrites_outside_the_memory_and_no_import_side_effects():
    rows, probes = count_jobs.count()
    assert rows["memory field rewrites"] == [], rows["memory field rewrites"]
    assert rows["import-time side effects"] == [], rows["import-time side effects"]
    assert set(probes) == {"txl_keras", "tf_records", "txl_io"}
    assert all(p == {"loaded": [], "environment_changed": [], "stderr_replaced": False} for p in probes.values())
    # both trainers' steps judge their gradients in one place
    assert [p for p in rows["training steps"] if not p.endswith(".compute_loss")] == \
        ["txl_keras/training/step.py:checked_gradients"]
    # one token loop (every sampler's, every caller's) and one prompt feed (generate's and the SavedModel's)
    assert sorted(p.split(":")[1] for p in rows["generation loops"]) == ["Sampler.search", "feed_context"]
    # every task loads a trained model through one from_preset
    assert [p for p in rows["from_preset meanings"] if "/tasks/" in p] == ["txl_keras/tasks/task.py:Task.from_preset"]
