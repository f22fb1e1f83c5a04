"""Gantt chart of a simulated (or measured) pipeline, as a PNG."""

from tfsparse.distribute import schedules as _schedules

_COLORS = {
    _schedules.FORWARD: "#4C72B0",
    _schedules.BACKWARD_INPUT: "#DD8452",
    _schedules.BACKWARD_WEIGHT: "#55A868",
    _schedules.UPDATE: "#C44E52",
}
_LABELS = {
    _schedules.FORWARD: "forward",
    _schedules.BACKWARD_INPUT: "backward (activation gradient)",
    _schedules.BACKWARD_WEIGHT: "backward (weight gradient)",
    _schedules.UPDATE: "update",
}


def plot_gantt(result, path, title=None):
    """Writes a Gantt chart of ``result.timeline`` (one row per stage) to ``path``.

    Args:
      result: a ``SimulationResult`` (``tfsparse.distribute.simulate``).
      path: where to write the PNG.
      title: chart title (default: the schedule, its cycles and its bubble).

    Returns:
      ``path``.

    Example:
      >>> import tempfile, os
      >>> from tfsparse.distribute import simulate
      >>> r = simulate("1f1b", [(1, 2, 1)] * 4, 4, 6)
      >>> out = plot_gantt(r, os.path.join(tempfile.mkdtemp(), "1f1b.png"))
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    sched = result.schedule
    num_stages = sched.num_stages
    width = max(6.0, min(24.0, 0.25 * len(result.timeline) / max(num_stages, 1) + 4))
    figure, axes = plt.subplots(figsize=(width, 0.55 * num_stages + 1.6))
    for action, start, end in result.timeline:
        if end <= start:
            continue
        row = num_stages - 1 - action.stage
        axes.broken_barh([(start, end - start)], (row - 0.4, 0.8),
                         facecolors=_COLORS[action.kind], edgecolor="white",
                         linewidth=0.4)
        if action.microbatch >= 0 and (end - start) > 0.02 * result.cycles:
            axes.text((start + end) / 2, row, str(action.microbatch), ha="center",
                      va="center", fontsize=6, color="white")
    axes.set_yticks(range(num_stages))
    axes.set_yticklabels([f"stage {s}" for s in reversed(range(num_stages))])
    axes.set_xlim(0, result.cycles)
    axes.set_xlabel("time (cost units)")
    used = sorted({a.kind for a, start, end in result.timeline if end > start},
                  key=list(_COLORS).index)
    figure.legend(handles=[Patch(color=_COLORS[k], label=_LABELS[k]) for k in used],
                  loc="lower center", ncol=len(used), fontsize=7, frameon=False)
    axes.set_title(title or (f"{sched.name}: P={num_stages}, M={sched.num_microbatches}, "
                             f"steps={sched.steps}, cycles={result.cycles:.4g}, "
                             f"bubble={result.bubble_fraction:.1%}"), fontsize=9)
    figure.tight_layout(rect=(0, 0.45 / (0.55 * num_stages + 1.6), 1, 1))
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
