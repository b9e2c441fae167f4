"""The generator engine of the rollout and reward roles: vLLM's CPU build, in-process,
driven step by step by the shift-aware scheduler's dispatches (sec. 6)."""

from pivot.roles.engine.config import EngineConfig, check_model_dir
from pivot.roles.engine.requests import GenRequest, RequestError, SampleSpec, SeqResult
from pivot.roles.engine.vllm_engine import EngineStats, ReleaseReport, VllmEngine

__all__ = ["EngineConfig", "EngineStats", "GenRequest", "ReleaseReport", "RequestError",
           "SampleSpec", "SeqResult", "VllmEngine", "check_model_dir"]
