"""Running a command-line program: a usage or input error is one line, not a traceback.

`run(main)` is `absl.app.run(main)` where a usage error (`app.UsageError`, an unknown
flag, a flag value outside its bounds) prints `error: ...` and exits 2, and a failure the user can fix (a missing or damaged
file, a value out of its domain, an unreachable bucket) prints `error: ...` and exits 1.
`--verbosity=1` (or higher) shows the traceback as well, and TensorFlow's and absl's
information lines, which are otherwise off (warnings and errors always show).

`--help` lists the flags by group (`GROUPS`: a flag's group is the `module_name` it was
defined with); `--helpfull` is absl's full list.
"""

import logging as std_logging
import math
import os
import re
import signal
import sys
import threading

from absl import app, flags, logging

from txl_io.files import StorageError

# What a user can fix from the message alone; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError, StorageError)


def _one_line(error):
    text = " ".join(str(error).split()) or type(error).__name__
    return text


GROUPS = ("run", "data", "model", "training", "checkpoints", "evaluation", "distribution", "speed and precision")
HELP_ARGS = ("--help", "-help", "-h", "-?", "--helpshort", "-helpshort")


def define(kind, name, default, help, group, **kwargs):
    """`flags.DEFINE_<kind>` with the flag listed under `group` (one of `GROUPS`) by --help."""
    if group not in GROUPS:
        raise ValueError(f"Unknown flag group {group!r}; expected one of {GROUPS}.")
    if kind == "enum":
        return flags.DEFINE_enum(name, default, kwargs.pop("enum_values"), help, module_name=group, **kwargs)
    return getattr(flags, f"DEFINE_{kind}")(name, default, help, module_name=group, **kwargs)


def grouped_help(doc):
    """`doc`, then the flags of each group that has any (absl's format, one section a group)."""
    sections = [flags.FLAGS.module_help(group) for group in GROUPS]
    return (doc or "").rstrip() + "\n\nflags (--helpfull: every flag, absl's own included):\n" + "\n".join(
        s.strip("\n") for s in sections if s.strip())


def _quiet_logs():
    """Information lines off unless --verbosity asks for them (warnings and errors stay)."""
    if flags.FLAGS["verbosity"].value <= 0:
        logging.set_verbosity(logging.WARNING)
        std_logging.getLogger("tensorflow").setLevel(std_logging.WARNING)


def _interrupt_on_sigint():
    """Ctrl-C (SIGINT) raises KeyboardInterrupt, even in a program that a shell started as a
    background job with SIGINT ignored: a user's `kill -INT` stops it as Ctrl-C would."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run(main):
    def guarded(argv):
        _interrupt_on_sigint()
        _quiet_logs()
        try:
            return main(argv)
        except app.UsageError as e:
            if flags.FLAGS["verbosity"].value > 0:
                raise
            sys.stderr.write(f"error: {_one_line(e)}\n")
            sys.exit(2)
        except KeyboardInterrupt as e:
            said = _one_line(e) if str(e) else "files are written atomically: what was saved stays complete; the " \
                "same command resumes"
            sys.stderr.write(f"error: interrupted ({said})\n")
            sys.exit(getattr(e, "exit_code", 130))
        except USER_ERRORS as e:
            if flags.FLAGS["verbosity"].value > 0:
                logging.exception("failed")
            sys.stderr.write(f"error: {_one_line(e)}\n")
            sys.exit(1)

    app.run(guarded, flags_parser=_parse_flags)


def _parse_flags(argv):
    """absl's flag parsing, a bad flag reported as a usage error (one line, exit 2); --help by group."""
    arguments = argv[1:argv.index("--")] if "--" in argv else argv[1:]
    if any(a in HELP_ARGS for a in arguments):
        if any(flags.FLAGS.module_help(g).strip() for g in GROUPS):
            print(grouped_help(sys.modules["__main__"].__doc__))
            sys.exit(0)
        app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)  # absl's own --help exits 1
    try:
        rest = flags.FLAGS(argv)
        check_flag_values(flags.FLAGS)
        return rest
    except (flags.Error, app.UsageError) as e:
        sys.stderr.write(f"error: {_one_line(e)} (see --help)\n")
        sys.exit(2)


# Flags whose value is a path (or a name that may be one): `~` is expanded, a URL missing its `//` refused.
PATH_FLAGS = ("cache_pkl", "checkpoint", "config", "config_json", "corpus_info_path", "data_dir", "eval_ckpt_path",
              "init_from", "model_dir", "output", "pretrained", "pytorch_state_dict", "records_dir", "text",
              "tf_checkpoint", "tfds_data_dir", "vocab", "warm_start_path")
# A local path starting like this was meant as a URL: `gs:bucket/run` would make a local folder `gs:bucket`.
_URL_WITHOUT_SLASHES = re.compile(r"^(gs|s3|hdfs|ram|file|http|https|az|abfs|abfss|viewfs):(?!//)")


def check_flag_values(values):
    """Every float flag finite, every path flag with `~` expanded and no URL missing its `//`."""
    for name in values:
        flag = values[name]
        value = flag.value
        if isinstance(value, float) and not math.isfinite(value):
            raise app.UsageError(f"--{name}={value} is not a finite number; give a finite value.")
        if name in PATH_FLAGS and isinstance(value, str):
            if flag.present and not value.strip():
                raise app.UsageError(f"--{name} is given empty; give a path, or leave the flag out.")
            if _URL_WITHOUT_SLASHES.match(value):
                scheme, rest = value.split(":", 1)
                raise app.UsageError(f"--{name}={value} looks like a URL missing its '//': did you mean "
                                     f"{scheme}://{rest.lstrip('/')}?")
            if value == "~" or value.startswith("~/"):
                flag.value = os.path.expanduser(value)
