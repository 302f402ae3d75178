"""The code blocks of the README and of docs/: read, split into commands, and checked."""

import glob
import os
import re
import shlex

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCUMENTS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
LANGUAGES = ("python", "sh", "text")

# The programs of this project, as a command names them, and the module that defines their flags.
PROGRAMS = {
    "train_gpu.py": "train_gpu.py",
    "train_tpu.py": "train_tpu.py",
    "-m tf_records": "tf_records.__main__",
    "-m txl_keras.export": "txl_keras.export.__main__",
    "-m txl_keras.generate": "txl_keras.generate.__main__",
    "-m txl_keras.convert": "txl_keras.convert.__main__",
    "-m txl_keras.training.average_checkpoints": "txl_keras.training.average_checkpoints",
}
# Commands of other tools the documents show (set-up, cloud, monitoring, the test runner).
OTHER_TOOLS = ("python3 -m venv", ".venv/bin/pip", "pip", "git", "gcloud", "tensorboard", "bash", "cd")


def read(document):
    with open(os.path.join(ROOT, document), encoding="utf-8") as f:
        return f.read()


def blocks(document, section=None):
    """`[(language, text)]` of the fenced code blocks of `document` (of one section: the text
    from the heading `section` to the next heading of its level or above)."""
    text = read(document)
    if section is not None:
        assert section + "\n" in text, f"{document} has no heading {section!r}"
        level = len(section) - len(section.lstrip("#"))
        body = text.split(section + "\n", 1)[1]
        ends = [m.start() for m in re.finditer(r"^#{1,%d} " % level, body, re.M)]
        text = body[:ends[0]] if ends else body
    found = [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S)]
    fences = len(re.findall(r"^```", text, re.M))
    assert fences == 2 * len(found), f"{document}: a code fence is not closed (a block would go unchecked)"
    return found


def commands(document, section=None):
    """The command lines of the `sh` blocks: continuation lines joined, comments dropped, and
    `a && b` split into its commands."""
    out = []
    for language, text in blocks(document, section):
        if language != "sh":
            continue
        for line in text.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            out.extend(part.strip() for part in _split_and(line) if part.strip())
    return out


def _split_and(line):
    """`a && b` -> `[a, b]`, leaving a `&&` inside quotes alone."""
    parts, current, quote, i = [], "", None, 0
    while i < len(line):
        char = line[i]
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif line.startswith("&&", i):
            parts.append(current)
            current, i = "", i + 2
            continue
        current += char
        i += 1
    return parts + [current]


def program_of(command):
    """`(program key of PROGRAMS, environment, arguments)` of a command, or None for another tool."""
    argv = shlex.split(command)
    environment = {}
    while argv and re.fullmatch(r"[A-Z_]+=.*", argv[0]):
        name, value = argv.pop(0).split("=", 1)
        environment[name] = value
    if argv and argv[0].endswith("python") or argv[:1] == ["python3"] and argv[1:2] != ["-m"]:
        argv = argv[1:]
        if argv[:1] == ["-m"]:
            key, argv = "-m " + argv[1], argv[2:]
        else:
            key, argv = argv[0], argv[1:]
        if key in PROGRAMS or key.startswith("bench/") and os.path.exists(os.path.join(ROOT, key)):
            return key, environment, argv
        if key == "-m pytest":
            return None
        raise AssertionError(f"{command!r} runs {key}, which is not one of the project's programs")
    if any(command.startswith(tool) or " ".join(argv).startswith(tool) for tool in OTHER_TOOLS):
        return None
    raise AssertionError(f"{command!r}: an unknown command")
