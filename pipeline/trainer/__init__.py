"""FSDP2 trainer: ``TrainerGroup`` (driver side) over ``TrainerWorker`` Ray actors (one per rank)."""
from pipeline.trainer.config import OptimConfig, TrainerConfig
from pipeline.trainer.group import TrainerGroup
from pipeline.trainer.plan import RankPlan, StepPlan, micro_weight, plan_step
from pipeline.trainer.worker import TrainerWorker

__all__ = ["OptimConfig", "TrainerConfig", "TrainerGroup", "TrainerWorker", "RankPlan", "StepPlan",
           "micro_weight", "plan_step"]
