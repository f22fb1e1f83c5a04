"""Layer pipelining: schedules as data, a simulator, and PipelineStrategy.

``schedule`` generates every stage's ordered actions for GPipe, 1F1B
(PipeDream-Flush), PipeDream, LayerPipe and AMPNet-style asynchronous
training; ``simulate`` replays them with per-layer costs (measured by
``profile`` or modelled by ``model_costs``); ``plot_gantt`` draws the result.

Example:
  >>> from tfsparse.distribute import simulate
  >>> costs = [(1.0, 1.0, 1.0)] * 4  # (forward, backward-input, backward-weight) per layer
  >>> gpipe, one_f_one_b = (simulate(name, costs, 4, 8) for name in ("gpipe", "1f1b"))
  >>> gpipe.cycles == one_f_one_b.cycles  # as fast, holding fewer activations per stage
  True
  >>> gpipe.peak_activations, one_f_one_b.peak_activations
  ((8, 8, 8, 8), (4, 3, 2, 1))
"""

from tfsparse.distribute.costs import model_costs
from tfsparse.distribute.costs import profile
from tfsparse.distribute.gantt import plot_gantt
from tfsparse.distribute.schedules import SCHEDULES
from tfsparse.distribute.schedules import Action
from tfsparse.distribute.schedules import Schedule
from tfsparse.distribute.schedules import schedule
from tfsparse.distribute.schedules import update_delays
from tfsparse.distribute.simulator import SimulationResult
from tfsparse.distribute.simulator import simulate
from tfsparse.distribute.stages import StagePlan
from tfsparse.distribute.stages import plan_stages
from tfsparse.distribute.strategy import PipelineStrategy

__all__ = [
    "Action",
    "PipelineStrategy",
    "SCHEDULES",
    "Schedule",
    "SimulationResult",
    "StagePlan",
    "model_costs",
    "plan_stages",
    "plot_gantt",
    "profile",
    "schedule",
    "simulate",
    "update_delays",
]
