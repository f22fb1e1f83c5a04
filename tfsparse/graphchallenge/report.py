"""The challenge's one-line result, and the peak memory reported with it.

The Sparse DNN Graph Challenge reports each run as neurons per layer, layers,
edges (the nonzeros of all layers, ``32 * N * L`` for its networks), the
inference time in seconds and the rate ``inputs * edges / seconds`` in edges
per second (Kepner et al., HPEC 2019). ``result_line`` writes those fields
in that order, with the number of inputs (60,000 in the challenge) and the
peak memory, as ``key=value`` pairs on one line a script can parse.
"""

from tfsparse._memory import peak_rss_bytes  # noqa: F401  (re-exported)
from tfsparse._validation import check_positive_int
from tfsparse._validation import invalid_value

_FIELDS = ("neurons", "layers", "edges", "inputs", "seconds", "edges_per_second", "peak_rss_mib")


def result_line(neurons, layers, edges, inputs, seconds, peak_rss=None):
    """Returns the one-line result of a run in the challenge's fields.

    Args:
        neurons: neurons per layer.
        layers: number of layers.
        edges: nonzeros of all layers.
        inputs: number of inputs inferred.
        seconds: inference time.
        peak_rss: peak resident memory in bytes, or None to leave it out.

    Returns:
        ``"RESULT neurons=... layers=... edges=... inputs=... seconds=...
        edges_per_second=... [peak_rss_mib=...]"``; the rate is
        ``inputs * edges / seconds``.

    Example:
        >>> result_line(1024, 120, 3932160, 60000, 2.0)
        'RESULT neurons=1024 layers=120 edges=3932160 inputs=60000 seconds=2.0 edges_per_second=1.1796e+11'
    """
    for name, value in (("neurons", neurons), ("layers", layers), ("edges", edges),
                        ("inputs", inputs)):
        check_positive_int(name, value)
    if not 0 < seconds < float("inf"):
        raise invalid_value("seconds", "a positive number", seconds)
    shown_seconds = float(f"{seconds:.6g}")  # 6 significant digits, read back as a float
    fields = [f"neurons={neurons}", f"layers={layers}", f"edges={edges}", f"inputs={inputs}",
              f"seconds={shown_seconds!r}", f"edges_per_second={inputs * edges / seconds:.4e}"]
    if peak_rss is not None:
        if isinstance(peak_rss, bool) or not 0 < peak_rss < float("inf"):
            raise invalid_value("peak_rss", "a positive number of bytes or None", peak_rss)
        # At least 1: a process holds more than half a MiB, and the parser wants > 0.
        fields.append(f"peak_rss_mib={max(1, round(peak_rss / 2**20))}")
    return "RESULT " + " ".join(fields)


def parse_result_line(line):
    """Returns the fields of a ``result_line`` as a dict of numbers.

    Example:
        >>> parse_result_line("RESULT neurons=1024 layers=2 edges=65536 inputs=10 "
        ...                   "seconds=0.5000 edges_per_second=1.3107e+06")["edges"]
        65536
    """
    words = line.split()
    if not words or words[0] != "RESULT":
        raise invalid_value("line", "a line starting with 'RESULT'", line)
    malformed = [word for word in words[1:] if "=" not in word]
    if malformed:
        raise invalid_value("line", "key=value fields after 'RESULT'",
                            received=f"the words {malformed} in {line!r}")
    pairs = [word.split("=", 1) for word in words[1:]]
    names = [name for name, _ in pairs]
    unknown = sorted(set(names) - set(_FIELDS))
    repeated = sorted({name for name in names if names.count(name) > 1})
    missing = [name for name in _FIELDS[:-1] if name not in names]  # peak memory is optional
    if unknown or repeated or missing:
        raise invalid_value(
            "line", f"each of the fields {_FIELDS} once (the last optional)",
            received=f"unknown {unknown}, repeated {repeated}, missing {missing} in {line!r}")
    fields = {}
    for name, value in pairs:
        counted = name in ("neurons", "layers", "edges", "inputs", "peak_rss_mib")
        try:
            # Counts are written as decimal integers, times and rates as floats.
            number = int(value) if counted and value.isdigit() else (
                None if counted else float(value))
        except ValueError:
            number = None
        if number is None or not 0 < number < float("inf"):
            expected = "a positive integer" if counted else "a positive finite number"
            raise invalid_value("line", f"{expected} for {name}",
                                received=f"{name}={value} in {line!r}")
        fields[name] = number
    return fields
