"""What each pipeline (``torch_spmd.distributed.pipeline``) ran in its last forward: the plan
report reads it to measure the bubble on the planned step."""
from dataclasses import dataclass
from typing import Dict, List


@dataclass
class Schedule:
    """What a pipeline's last forward ran: its iterations' scopes and how many stages worked
    on a real micro-batch in each (the rest ran the bubble)."""
    path: str
    stages: int
    microbatches: int
    repeats: int
    busy_stages: List[int]

    @property
    def iterations(self) -> int:
        return len(self.busy_stages)

    @property
    def bubble_fraction(self) -> float:
        """Of the loop's stage-iterations, the share spent on no micro-batch."""
        return 1.0 - sum(self.busy_stages) / (self.stages * self.iterations)


# Module path of each pipeline that ran -> the schedule of its last forward.
_schedules: Dict[str, Schedule] = {}


def record_schedule(schedule: Schedule) -> None:
    _schedules[schedule.path] = schedule


def last_schedules() -> Dict[str, Schedule]:
    return dict(_schedules)
