"""Simulated models: decode, prefill, KV capacity, training time and shift cost (sec. 8.1).

Every number here is a gin binding in ``gin/<group>.gin`` with its source; the maths is
plain functions of those numbers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import gin

from pivot.config.validation import check, check_bool, check_range, check_text
from pivot.errors import ConfigError
from pivot.scheduler.throughput import ThroughputModel
from pivot.spec import roofline
from pivot.spec.stand_in import H20_BF16_TFLOPS, StandIn, h20_profile
from pivot.spec.roofline import Architecture

H20_MEMORY_BYTES = 96e9
"""Per-device HBM of the paper's H20 (sec. 8.1)."""


@gin.configurable
@dataclass(frozen=True)
class ModelProfile:
    """One model as served by an inference replica (or trained), on H20.

    Attributes:
        name: model name (table 1).
        params_b / active_params_b: total and per-token active parameters, billions.
        kv_bytes_per_token: KV cache bytes per token over all layers (bf16).
        devices: devices per replica, TP x EP (table 1).
        arch: the model's shape (its ``config.json``); decode and prefill then come from
            the H20 roofline and the fitted serving overheads (``pivot.spec.roofline``).
        stand_in: the calibrated H100 configuration its decode model is scaled from
            (used only without ``arch``).
        prefill_mfu: fraction of H20 bf16 peak a prefill reaches (compute bound).
        mem_util: fraction of HBM vLLM may use (``gpu_memory_utilization``).
        max_num_seqs: the engine's batch cap (vLLM ``max_num_seqs``; None: KV only).
        throughput: explicit A, B, C, D (seconds); None means ``arch`` or ``stand_in``.
    """

    name: str
    params_b: float
    active_params_b: float
    kv_bytes_per_token: float
    devices: int
    stand_in: StandIn | None = None
    prefill_mfu: float = 0.5
    mem_util: float = 0.9
    throughput: ThroughputModel | None = None
    arch: Architecture | None = None
    max_num_seqs: int | None = None

    def __post_init__(self) -> None:
        b = "ModelProfile"   # scoped in the gin files: policy/ModelProfile, genrm/ModelProfile
        check_text(f"{b}.name", self.name)
        check_range(f"{b}.params_b", self.params_b, 0, open_lo=True,
                    why=f"{self.name}: billions of parameters")
        check_range(f"{b}.active_params_b", self.active_params_b, 0, self.params_b,
                    open_lo=True, why=f"{self.name}: at most params_b={self.params_b}")
        check_range(f"{b}.kv_bytes_per_token", self.kv_bytes_per_token, 0, open_lo=True,
                    why=self.name)
        check_range(f"{b}.devices", self.devices, 1, integer=True,
                    why=f"{self.name}: TP x EP devices per replica")
        check_range(f"{b}.prefill_mfu", self.prefill_mfu, 0, 1, open_lo=True, why=self.name)
        check_range(f"{b}.mem_util", self.mem_util, 0, 1, open_lo=True, why=self.name)
        check(self.stand_in is None or isinstance(self.stand_in, StandIn), f"{b}.stand_in",
              self.stand_in, "must be a StandIn (e.g. @policy/StandIn()) or None")
        check(self.throughput is None or isinstance(self.throughput, ThroughputModel),
              f"{b}.throughput", self.throughput, "must be a ThroughputModel or None")
        check(self.arch is None or isinstance(self.arch, Architecture), f"{b}.arch",
              self.arch, "must be an Architecture (e.g. @policy/Architecture()) or None")
        if self.max_num_seqs is not None:
            check_range(f"{b}.max_num_seqs", self.max_num_seqs, 1, integer=True,
                        why=f"{self.name}: the engine's batch cap, or None")
        if self.stand_in is None and self.throughput is None and self.arch is None:
            raise ConfigError(f"ModelProfile {self.name}: bind ModelProfile.arch (the "
                              f"model's shape), ModelProfile.stand_in (a calibration row) "
                              f"or ModelProfile.throughput")
        if self.arch is not None:
            total = self.arch.total_params / 1e9
            if abs(total - self.params_b) > 0.05 * self.params_b:
                raise ConfigError(f"ModelProfile {self.name}: params_b={self.params_b} but "
                                  f"its Architecture has {total:.2f} B parameters; fix one")
            if self.arch.kv_bytes_per_token != self.kv_bytes_per_token:
                raise ConfigError(f"ModelProfile {self.name}: kv_bytes_per_token="
                                  f"{self.kv_bytes_per_token} but its Architecture has "
                                  f"{self.arch.kv_bytes_per_token}; fix one")
        if self.kv_capacity() <= 0:
            raise ConfigError(
                f"ModelProfile {self.name}: {self.weight_bytes / 1e9:.0f} GB of weights "
                f"do not fit {self.devices} x 96 GB at mem_util={self.mem_util}; raise "
                f"ModelProfile.devices (TP/EP) in the model group's gin file")

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * 2.0  # bf16

    def decode_model(self) -> ThroughputModel:
        """A, B, C, D of this model on one replica (fitted, then scaled to H20)."""
        if self.throughput is not None:
            return self.throughput
        if self.arch is not None:
            return _roofline(self.arch, self.devices)
        return _fitted(self.stand_in)

    def kv_capacity(self) -> int:
        """Tokens of KV cache one replica holds: free HBM over KV bytes per token."""
        free = self.devices * H20_MEMORY_BYTES * self.mem_util - self.weight_bytes
        return int(free / self.kv_bytes_per_token)

    def prefill_rate(self) -> float:
        """Prefill tokens per second of one replica: 2 x active params FLOPs per token
        (with ``arch``: compute parameters plus attention, ``roofline.prefill_rate``)."""
        if self.arch is not None:
            return roofline.prefill_rate(self.arch, self.devices, self.prefill_mfu)
        flops = self.devices * H20_BF16_TFLOPS * 1e12 * self.prefill_mfu
        return flops / (2.0 * self.active_params_b * 1e9)


@functools.lru_cache(maxsize=32)
def _roofline(arch: Architecture, devices: int) -> ThroughputModel:
    return roofline.decode_model(arch, devices)


@functools.lru_cache(maxsize=32)
def _fitted(stand_in: StandIn) -> ThroughputModel:
    return h20_profile(stand_in)[0]


@gin.configurable
@dataclass(frozen=True)
class TrainingProfile:
    """Policy training time per RL step: actor update plus, optionally, the old log-prob
    (and reference log-prob) forward (sec. 8.1; verl's step split). Two parameters per
    phase, on the phase's FLOPs k * P * tokens (k = 6 for the update, forward + backward;
    2 for a log-prob forward; P the active parameters; peak one H20's bf16 FLOP/s):

        update:    seconds = 6 P tokens / (peak * mfu) * max(serial, 1 / devices)
        log-prob:  seconds = 2 P tokens / (peak * mfu) * (serial + (1 - serial) / devices)

    The update is its parallel work or a floor that more devices do not lower, whichever is
    longer: verl's update runs train_batch / ppo_mini_batch = 16 optimizer steps one after
    another, each at least as long as its longest sequence (up to 2K + 28K tokens) takes on
    one sequence-parallel group (4 devices): a 30K-token sequence of Qwen2.5-7B is 6 x 7.07 G
    linear plus ~18 G attention FLOPs a token, 7.6 s at MFU 0.4, 16 x 7.6 = 122 s. verl's rows show
    exactly this: the update halves from 32 to 64 colocated devices (269.8 -> 133.4 s) and
    from 16 to 32 fully async ones (313.8 -> 157.0 s), then stops at 113.8 s (128
    colocated) and 113.2 s (64 fully async), the same floor in both trainers. The old
    log-prob pass (one forward, no optimizer steps) follows Amdahl's law (serial: the
    fraction that does not shrink with devices). ``mfu`` is the efficiency of one device
    doing all the work. Fitted by ``benchmarks/calibrate.py`` to verl's DAPO 7B rows of each
    trainer (``pivot.sim.verl_fit.fit_floor`` / ``fit_amdahl``). That the floor and the
    serial part scale with FLOPs (rather than with the longest sequence) is an assumption:
    verl's rows train one model on one workload, so they cannot tell these apart.

    Attributes:
        devices: training devices (table 4's training column).
        update_mfu / logprob_mfu: efficiency of the work at one device (fitted; required:
            ``gin/base.gin`` binds ``benchmarks/calibrate.py``'s fit).
        update_serial: the update's floor as a fraction of its one-device time, in [0, 1)
            (fitted, required; 0: no floor, seconds = work / (devices * peak * mfu)).
        logprob_serial: the log-prob pass's Amdahl serial fraction in [0, 1) (fitted,
            required).
        old_logprob: whether a step recomputes old log-probs (verl colocated does; verl's
            fully async trainer takes them from the rollout).
        ref_logprob: whether a step runs the reference model's forward pass for a KL term
            (verl with ``use_kl_loss`` or ``use_kl_in_reward``; DAPO uses neither, verl's
            GRPO 30B-A3B runs do). It is a forward over the same tokens as the old
            log-prob pass, so it takes that phase's MFU and serial fraction.
        overhead_s: fixed seconds per step (0: the verl split has no separate term).
    """

    devices: int
    update_mfu: float = gin.REQUIRED
    logprob_mfu: float = gin.REQUIRED
    update_serial: float = gin.REQUIRED
    logprob_serial: float = gin.REQUIRED
    old_logprob: bool = True
    ref_logprob: bool = False
    overhead_s: float = 0.0

    def __post_init__(self) -> None:
        check_range("TrainingProfile.devices", self.devices, 1, integer=True)
        for k in ("update_mfu", "logprob_mfu"):
            check_range(f"TrainingProfile.{k}", getattr(self, k), 0, 1, open_lo=True)
        for k in ("update_serial", "logprob_serial"):
            check_range(f"TrainingProfile.{k}", getattr(self, k), 0, 1, open_hi=True,
                        why="floor / serial fraction of the one-device time")
        check_bool("TrainingProfile.old_logprob", self.old_logprob)
        check_bool("TrainingProfile.ref_logprob", self.ref_logprob)
        check_range("TrainingProfile.overhead_s", self.overhead_s, 0, why="seconds")

    @staticmethod
    def amdahl(flops: float, mfu: float, serial: float, devices: int) -> float:
        """Seconds of ``flops`` on ``devices`` H20 with efficiency ``mfu`` and serial
        fraction ``serial``."""
        return flops / (H20_BF16_TFLOPS * 1e12 * mfu) * (serial + (1 - serial) / devices)

    @staticmethod
    def floored(flops: float, mfu: float, floor: float, devices: int) -> float:
        """Seconds of ``flops`` on ``devices`` H20 with efficiency ``mfu``, never below
        ``floor`` of the one-device time."""
        return flops / (H20_BF16_TFLOPS * 1e12 * mfu) * max(floor, 1.0 / devices)

    def phase_seconds(self, policy: ModelProfile, tokens: int, devices: int) -> dict[str, float]:
        """Seconds of each training phase for a batch of ``tokens`` on ``devices``."""
        flops = policy.active_params_b * 1e9 * tokens
        out = {"update_actor": self.floored(6.0 * flops, self.update_mfu, self.update_serial,
                                            devices)}
        if self.old_logprob:
            out["old_log_prob"] = self.amdahl(2.0 * flops, self.logprob_mfu,
                                              self.logprob_serial, devices)
        if self.ref_logprob:
            out["ref_log_prob"] = self.amdahl(2.0 * flops, self.logprob_mfu,
                                              self.logprob_serial, devices)
        return out

    def step_seconds(self, policy: ModelProfile, tokens: int, devices: int) -> float:
        return sum(self.phase_seconds(policy, tokens, devices).values()) + self.overhead_s


@gin.configurable
@dataclass(frozen=True)
class ShiftCost:
    """Bytes-over-bandwidth shift costs (sec. 5, fig. 12/13).

    Inference shift up reads the replica's weights (per host) from GPS host memory at an
    effective ``inference_read_gbs`` with a ``remote_fraction`` over RDMA (``rdma_gbs``,
    50 GB/s, sec. 5.1) and pays a fixed ``inference_up_s`` (engine re-initialisation: KV
    cache and CUDA graphs). Shift down discards parameters and temporary context:
    ``inference_down_s``. Training up reloads weights, gradients and Adam state (16
    bytes/param, sharded over its hosts) at ``training_read_gbs`` plus ``training_up_s``;
    training down offloads the same bytes over PCIe (``pcie_gbs``, 63 GB/s, sec. 5.1)
    plus ``training_down_s``. The effective bandwidths and fixed constants of shift up
    (``inference_read_gbs``, ``inference_up_s``, ``training_read_gbs``, ``training_up_s``)
    are fitted to the paper's fig. 12/13 overheads by ``pivot.sim.verl_fit.fit_shift_cost``
    (``benchmarks/calibrate.py``) and have no default: ``gin/base.gin`` binds the fit. 63
    GB/s (Hopper PCIe) and 50 GB/s (RDMA) are the links' peaks (sec. 5.1), not what a shift
    reaches. ``remote_fraction`` 0: the replication-first GPS layout fits host memory
    (app. B). Shift down's constants are assumptions within fig. 12's bounds (inference
    down < 2 s, training down < 6 s; ``benchmarks/calibrate.py`` checks them).

    ``devices_per_host`` is not a binding of its own: a ``ModelGroup`` gives its shift
    cost the group's ``ModelGroup.devices_per_host`` (``on_hosts``); a standalone
    ``ShiftCost`` (calibration) has the paper's 8-device hosts.
    """

    inference_read_gbs: float = gin.REQUIRED
    inference_up_s: float = gin.REQUIRED
    training_read_gbs: float = gin.REQUIRED
    training_up_s: float = gin.REQUIRED
    pcie_gbs: float = 63.0
    rdma_gbs: float = 50.0
    remote_fraction: float = 0.0
    inference_down_s: float = 0.5
    training_down_s: float = 1.0
    devices_per_host: int = field(default=8, init=False)

    def __post_init__(self) -> None:
        for k in ("pcie_gbs", "rdma_gbs", "inference_read_gbs", "training_read_gbs"):
            check_range(f"ShiftCost.{k}", getattr(self, k), 0, open_lo=True, why="GB/s")
        check_range("ShiftCost.remote_fraction", self.remote_fraction, 0, 1)
        for k in ("inference_up_s", "inference_down_s", "training_up_s", "training_down_s"):
            check_range(f"ShiftCost.{k}", getattr(self, k), 0, why="seconds")

    def on_hosts(self, devices_per_host: int) -> "ShiftCost":
        """This cost on hosts of ``devices_per_host`` devices (the model group's)."""
        out = replace(self)
        object.__setattr__(out, "devices_per_host", devices_per_host)
        return out

    def _read(self, nbytes: float, gbs: float | None = None) -> float:
        local = nbytes * (1 - self.remote_fraction) / ((gbs or self.pcie_gbs) * 1e9)
        return local + nbytes * self.remote_fraction / (self.rdma_gbs * 1e9)

    def inference_up(self, m: ModelProfile) -> dict[str, float]:
        hosts = max(1, math.ceil(m.devices / self.devices_per_host))
        return {"read_parameters": self._read(m.weight_bytes / hosts, self.inference_read_gbs),
                "reallocate_temporary": self.inference_up_s}

    def inference_down(self, m: ModelProfile) -> dict[str, float]:
        return {"discard": self.inference_down_s}

    def training_bytes_per_host(self, m: ModelProfile, devices: int) -> float:
        hosts = max(1, math.ceil(devices / self.devices_per_host))
        return m.params_b * 1e9 * 16.0 / hosts

    def training_up(self, m: ModelProfile, devices: int) -> dict[str, float]:
        return {"reload_offloadable": self._read(self.training_bytes_per_host(m, devices),
                                                 self.training_read_gbs),
                "reallocate_temporary": self.training_up_s}

    def training_down(self, m: ModelProfile, devices: int) -> dict[str, float]:
        return {"offload": self.training_bytes_per_host(m, devices) / (self.pcie_gbs * 1e9),
                "discard": self.training_down_s}

    def weight_update(self, m: ModelProfile) -> float:
        """A rollout replica's read of new policy weights after a training step (GPS
        Write is overlapped with the next step, sec. 5.1)."""
        hosts = max(1, math.ceil(m.devices / self.devices_per_host))
        return self._read(m.weight_bytes / hosts, self.inference_read_gbs)
