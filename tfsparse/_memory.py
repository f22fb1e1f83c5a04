"""This process's resident memory as the kernel counts it (Linux ``/proc``).

Peaks are read from ``VmHWM``, the high-water mark of this process's own
memory map: it counts everything the process touched (TensorFlow's buffers,
NumPy and SciPy arrays), which ``tracemalloc`` would not see. Not
``ru_maxrss`` on Linux: it is carried across ``execve``, so a process started
by a larger one (a benchmark driver, pytest) would report that parent's peak.
"""

import resource
import sys

_STATUS = "/proc/self/status"


def status_kib(field):
    """Returns a ``kB`` field of ``/proc/self/status`` (``"VmRSS"``, ``"VmHWM"``).

    Raises:
      OSError: where ``/proc/self/status`` does not exist (not Linux).
      KeyError: if the file has no such field.

    Example:
        >>> status_kib("VmRSS") > 0
        True
    """
    with open(_STATUS) as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(f"{field!r} is not a field of {_STATUS}")


def peak_rss_bytes():
    """Returns the peak resident memory of this process so far, in bytes.

    ``VmHWM`` on Linux; elsewhere ``ru_maxrss`` (whose caveat is above).

    Example:
        >>> peak_rss_bytes() > 0
        True
    """
    try:
        return status_kib("VmHWM") * 1024
    except (OSError, KeyError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # kilobytes on Linux


def reset_peak_rss():
    """Resets this process's ``VmHWM`` to its current ``VmRSS`` (Linux >= 4.0).

    Example:
        >>> reset_peak_rss()
        >>> peak_rss_bytes() >= status_kib("VmRSS") * 1024 - 2**20
        True
    """
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
