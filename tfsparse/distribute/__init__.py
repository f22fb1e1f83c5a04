"""Layer pipelining: schedules as data, a simulator, and PipelineStrategy.

``schedule`` generates every stage's ordered actions for GPipe, 1F1B
(PipeDream-Flush), PipeDream, LayerPipe and AMPNet-style asynchronous
training; ``simulate`` replays them with per-layer costs (measured by
``profile`` or modelled by ``model_costs``); ``plot_gantt`` draws the result.
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
