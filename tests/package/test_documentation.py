"""Every code block of the README and of docs/ runs as written, so that they cannot drift
from the software: the Python blocks run as pasted (on tiny stand-ins of the run folder,
the export and the released models they name), a `print(...)  # value` prints that value,
the commands that can run here run on tiny stand-ins of the files they name, and every
other command names a program of the project with flags that program defines and accepts."""

import ast
import collections
import importlib.util
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
from documents import DOCUMENTS, LANGUAGES, PROGRAMS, ROOT, blocks, commands, program_of, read
from original_formats import CASES, tf_arrays, write_cache_pkl, write_tf_checkpoint
from release_server import serve

from txl_keras import releases


def test_every_block_is_fenced_with_a_known_language():
    for document in DOCUMENTS:
        text = read(document)
        outside = re.sub(r"^```\w*\n.*?^```$", "", text, flags=re.M | re.S)
        assert not re.search(r"^ {4}\S", outside, re.M), f"{document}: an indented block outside a fence"
        for language, _ in blocks(document):
            assert language in LANGUAGES, f"{document}: a ```{language} block"


def env(**extra):
    out = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    out.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
    return out


def parse_flags(key, module_name, argvs):
    """Parse each of `argvs` with the flags of program `key` (`module_name`, a file or a
    module, loaded afresh as its command line loads it), here; the flags it defined are
    removed afterwards. An unknown flag or a value out of its domain raises."""
    from absl import flags

    known = set(flags.FLAGS)
    try:
        if module_name.endswith(".py"):
            spec = importlib.util.spec_from_file_location("documented_program", os.path.join(ROOT, module_name))
        else:
            spec = importlib.util.find_spec(module_name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        getattr(module, "define_flags", lambda: None)()
        for argv in argvs:
            flags.FLAGS.unparse_flags()
            try:
                flags.FLAGS([key] + [a for a in argv if a != "..."])
            except flags.Error as e:
                raise AssertionError(f"{key} {' '.join(argv)}: {e}") from None
    finally:
        for name in set(flags.FLAGS) - known:
            delattr(flags.FLAGS, name)
        flags.FLAGS.unparse_flags()


def test_every_command_runs_a_program_of_the_project_with_flags_it_defines():
    by_program = collections.defaultdict(list)
    for document in DOCUMENTS:
        for command in commands(document):
            found = program_of(command)
            if found:
                by_program[found[0]].append(found[2])
    assert {"train_gpu.py", "train_tpu.py", "-m tf_records", "-m txl_keras.export", "-m txl_keras.generate",
            "-m txl_keras.convert", "bench/train_throughput.py"} <= set(by_program)
    for key in [k for k in by_program if k.startswith("bench/")]:  # argparse scripts: their options
        source = read(key)
        for argv in by_program.pop(key):
            for argument in argv:
                name = argument.split("=")[0]
                assert f'add_argument("{name}"' in source, f"{key} has no option {name}"
    for key, argvs in by_program.items():  # in this process: the flags a program defines are plain data
        parse_flags(key, PROGRAMS[key], argvs)


def checked_script(code):
    """The blocks' code with each `print(...)  # value` line checking that it prints `value`
    (the comment's text before a colon: a Python literal, or the exact text)."""
    lines = ["import ast as _ast", "def _printed(expected, *values):",
             "    text = ' '.join(str(v) for v in values)",
             "    print(text)",
             "    try:",
             "        same = _ast.literal_eval(text) == _ast.literal_eval(expected)",
             "    except (ValueError, SyntaxError):",
             "        same = text == expected",
             "    assert same, f'printed {text!r}, the document says {expected!r}'"]
    for line in code.splitlines():
        match = re.fullmatch(r"(\s*)print\((.*)\)\s+#\s*(.*)", line)
        if match:
            indent, arguments, comment = match.groups()
            expected = comment.split(":")[0].strip()
            try:
                ast.literal_eval(expected)
                literal = True
            except (ValueError, SyntaxError):
                literal = ":" in comment
            if literal:
                line = f"{indent}_printed({expected!r}, {arguments})"
        lines.append(line)
    return "\n".join(lines) + "\n"


def run_python(code, cwd, timeout=600, **extra):
    result = subprocess.run(["timeout", "-k", "10", str(timeout), sys.executable, "-c", checked_script(code)],
                            cwd=str(cwd), env=env(**extra), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def run_command(command, cwd, timeout=300):
    """A documented command as written, in `cwd` (a stand-in for the repository's root)."""
    for script in ("train_gpu.py", "train_tpu.py"):
        if not os.path.exists(os.path.join(cwd, script)):
            os.symlink(os.path.join(ROOT, script), os.path.join(cwd, script))
    argv = shlex.split(command)
    argv[0] = sys.executable if argv[0] == "python" else argv[0]
    result = subprocess.run(["timeout", "-k", "10", str(timeout)] + argv, cwd=str(cwd), capture_output=True,
                            text=True, env=env())
    assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
    return result


def python_blocks(document):
    return [text for language, text in blocks(document) if language == "python"]


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if d != "README.md" and python_blocks(d)])
def test_the_python_blocks_of_the_docs_run_as_pasted(document, tmp_path):
    run_python("\n".join(python_blocks(document)), tmp_path)


def quickstart_stand_in(cwd):
    """A tiny byte-level run where the first command leaves its run folder."""
    from tf_records import build_records

    import inspect
    import json

    # (the README's blocks read a standard-library module and prompt with Python: every byte of them)
    (cwd / "source.py").write_text("import os\nimport sys\n\n\ndef main(argv):\n    return len(argv)\n" * 200
                                   + inspect.getsource(json) + "class Config:\n")
    records = build_records("text", str(cwd / "records"), text=str(cwd / "source.py"), level="byte",
                            splits=["train", "valid"], tgt_len=8, per_host_train_bsz=4, per_host_valid_bsz=4,
                            log=lambda *_: None)
    run_command(f"python train_gpu.py --config=tiny --data_dir={records} --model_dir=runs/quickstart --tgt_len=8 "
                "--mem_len=8 --train_batch_size=4 --eval_batch_size=4 --train_steps=4 --iterations=2 "
                "--do_eval=false", cwd)


# A Python without txl_keras: the SavedModel is all a server needs.
WITHOUT_TXL_KERAS = "import sys\nsys.modules['txl_keras'] = None\nsys.modules['tf_records'] = None\nsys.modules['txl_io'] = None\n"


@pytest.mark.slow
def test_the_readme_runs_as_pasted(tmp_path):
    """The first command's run folder stood in for by a tiny run, the released models by
    stand-ins on a local server: the README's commands of using a trained model, then its
    Python blocks in one process (the SavedModel's in a Python without txl_keras)."""
    quickstart_stand_in(tmp_path)
    using = commands("README.md", "### Generate and score from the command line") + \
        commands("README.md", "### Export a SavedModel")
    assert [c.split()[:3] for c in using] == [["python", "-m", "txl_keras.generate"]] * 2 + \
        [["python", "-m", "txl_keras.export"]]
    results = [run_command(command, tmp_path) for command in using]
    assert [r.stderr for r in results] == ["", "", ""]  # the programs' own lines only, on stdout
    outputs = [r.stdout for r in results]
    assert outputs[0].strip().startswith("def main(")
    assert re.search(r"perplexity [\d.]+", outputs[1]) and "bits per character" in outputs[1]
    library = python_blocks("README.md")
    served = [b for b in library if "tf.saved_model.load" in b]
    assert len(served) == 1
    with serve(str(tmp_path / "server")) as (_, url):
        printed = run_python("\n".join(b for b in library if b not in served), tmp_path,
                             KERAS_HOME=str(tmp_path / "keras"), **{releases.URL_VARIABLE: url})
    assert "def main(" in printed and "The history of" in printed
    generated = run_python(WITHOUT_TXL_KERAS + served[0], tmp_path)  # the prompt and 40 bytes, decoded
    assert generated.startswith("def main(") and len(generated.encode()) > len("def main(") + 20


WORDS = ["<eos>", "the", "of", "and", "in", "to", "a", "was", "history", "The", "is", "on", "for", "as", "with",
         "by", "at", "he", "from", "that", "his", "it", "an", "were", "are", "which", "be", "this", "<unk>", "or"]


@pytest.mark.slow
def test_converting_an_original_checkpoint_as_documented(tmp_path):
    """docs/converting.md: convert an original TF checkpoint and its cache.pkl, build the test
    records with its vocabulary, evaluate with the paper's memory settings, generate until
    <eos>, all on tiny stand-ins of the files the commands name."""
    chain = commands("docs/converting.md", "## An original TensorFlow checkpoint")
    assert [c.split()[:3] for c in chain] == [
        ["bash", "sota/download.sh"], ["python", "-m", "txl_keras.convert"], ["python", "-m", "tf_records"],
        ["python", "train_gpu.py", "--do_train=false"], ["python", "-m", "txl_keras.generate"]]
    arrays, _ = tf_arrays(np.random.default_rng(0), *CASES["wt103"])
    assert CASES["wt103"][0] == len(WORDS)
    arrays["transformer/adaptive_softmax/cutoff_0/b"][0] = 60.0  # the model always says <eos>
    source = tmp_path / "pretrained_xl" / "tf_wt103"
    (source / "model").mkdir(parents=True)
    (source / "data").mkdir()
    write_tf_checkpoint(str(source / "model" / "model.ckpt-0"), arrays)
    write_cache_pkl(str(source / "data" / "cache.pkl"), WORDS, unk="<unk>", dataset="wt103")
    raw = tmp_path / "raw" / "wt103"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for split in ("train", "valid", "test"):
        lines = [" ".join(rng.choice(WORDS[1:28], 12)) for _ in range(40)]
        (raw / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")
    for command in chain[1:4]:
        result = run_command(command, tmp_path)
    line = [line for line in result.stdout.splitlines() if line.startswith("eval test:")][-1]
    assert "tokens 519 of 519" in line  # every token but the first, once (40 lines of 12 words + <eos>)
    out = run_command(chain[4], tmp_path).stdout.strip().splitlines()[-1]
    assert out == "The history of"  # printing ends at the stop symbol, <eos> written as a line break
