"""The inference engine: explicit state, ``update(state, batch) -> (state, info)``."""
from .engine import SVI, EngineState, UpdateInfo, batch_vi
from .gradients import GradientVI
from .schedules import Constant, RobbinsMonro, Schedule, schedule_from_dict
from .state import load_state, save_state

__all__ = ["SVI", "GradientVI", "EngineState", "UpdateInfo", "batch_vi", "Constant", "RobbinsMonro",
           "Schedule", "schedule_from_dict", "load_state", "save_state"]
