"""Running a command-line program: a usage or input error is one line, not a traceback.

`run(main)` is `absl.app.run(main)` where a usage error (`app.UsageError`, an unknown
flag, a flag value outside its bounds) prints `error: ...` and exits 2, and a failure the user can fix (a missing or damaged
file, a value out of its domain, an unreachable bucket) prints `error: ...` and exits 1.
`--verbosity=1` (or higher) shows the traceback as well.
"""

import sys

from absl import app, flags, logging

from tf_records.files import StorageError

# What a user can fix from the message alone; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError, StorageError)


def _one_line(error):
    text = " ".join(str(error).split()) or type(error).__name__
    return text


def run(main):
    def guarded(argv):
        try:
            return main(argv)
        except app.UsageError as e:
            if flags.FLAGS["verbosity"].value > 0:
                raise
            sys.stderr.write(f"error: {_one_line(e)}\n")
            sys.exit(2)
        except KeyboardInterrupt:
            sys.stderr.write("error: interrupted (files are written atomically: what was saved stays "
                             "complete; the same command resumes)\n")
            sys.exit(130)
        except USER_ERRORS as e:
            if flags.FLAGS["verbosity"].value > 0:
                logging.exception("failed")
            sys.stderr.write(f"error: {_one_line(e)}\n")
            sys.exit(1)

    app.run(guarded, flags_parser=_parse_flags)


def _parse_flags(argv):
    """absl's flag parsing, a bad flag reported as a usage error (one line, exit 2)."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        sys.stderr.write(f"error: {_one_line(e)} (see --help)\n")
        sys.exit(2)
