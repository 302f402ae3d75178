"""Where a TensorFlow step's time goes, by op type: the TensorFlow profiler's trace of a
call, summed per kernel type (matrix products, casts, random bits, copies ...).

The sums are op time: with two inter-op threads two ops run at once, so they add up to
more than the wall time. They say which kinds of work a step is made of, not its length.
"""

import collections
import glob
import tempfile


def op_ms_by_type(run, calls=1):
    """`({op type: (milliseconds per call, ops per call)}, total op ms per call)` of `run()`
    traced by the profiler, over `calls` calls of it."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with tempfile.TemporaryDirectory() as folder:  # the trace is read here, not kept
        tf.profiler.experimental.start(folder)
        try:
            for _ in range(calls):
                run()
        finally:
            tf.profiler.experimental.stop()
        with open(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0], "rb") as f:
            space.ParseFromString(f.read())
    ms, count = collections.Counter(), collections.Counter()
    for plane in space.planes:
        if "/host:CPU" not in plane.name:
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                # a kernel's event is "<node name>:<op type>"; executor and function events are not
                if ":" not in name or "::" in name:
                    continue
                kind = name.rsplit(":", 1)[1]
                if kind.startswith(" "):  # "EagerLocalExecute: <function>": the whole call
                    continue
                ms[kind] += event.duration_ps / 1e9 / calls
                count[kind] += 1
    by_type = {kind: (ms[kind], count[kind] / calls) for kind in ms}
    return by_type, sum(ms.values())


def print_op_profile(by_type, total, wall_ms, top=14, overlap=True):
    """The `top` op types by time, with their share of the op time (`overlap`: ops ran on
    several inter-op threads at once)."""
    note = "; ops on two inter-op threads overlap" if overlap else "; one op at a time"
    print(f"op time {total:.0f} ms per step (wall {wall_ms:.0f} ms{note}):")
    for kind, (ms, n) in sorted(by_type.items(), key=lambda item: -item[1][0])[:top]:
        print(f"  {kind:<32} {ms:8.1f} ms {100 * ms / total:5.1f}%  {n:6.0f} ops")
