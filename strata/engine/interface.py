"""The engine's interface: everything front ends (HTTP, CLI, chat, the Python API, cluster
replicas) use of `strata.engine`. Nothing outside engine/ imports another module of it
(tests/unit/test_seams.py checks); the step records are in strata/step.py."""

from strata.engine.engine import Engine
from strata.engine.info import EngineInfo
from strata.engine.outputs import Collected, collect
from strata.engine.picture import GroupPicture, LanePicture, ParkedPicture, PoolPicture
from strata.engine.prompt import Prompt, check_prompt
from strata.engine.request import RequestOutput, Timings
from strata.engine.session import SessionRestored, SessionSaved
from strata.engine.session_jobs import SessionJob
from strata.engine.snapshot import EngineSnapshot, LaneView
from strata.engine.stats import PoolCounters, PoolStats

__all__ = [
    "Collected",
    "Engine",
    "EngineInfo",
    "EngineSnapshot",
    "GroupPicture",
    "LanePicture",
    "LaneView",
    "ParkedPicture",
    "PoolCounters",
    "PoolPicture",
    "PoolStats",
    "Prompt",
    "RequestOutput",
    "SessionJob",
    "SessionRestored",
    "SessionSaved",
    "Timings",
    "check_prompt",
    "collect",
]
