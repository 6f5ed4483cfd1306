"""Op-agnostic machinery: Operation, Executor, selectors, caches, autotuner, params."""

from kernelops.ops.autotune import Autotuner, AutotunePolicy, TuneResult
from kernelops.ops.cache import ConfigCache
from kernelops.ops.device import DeviceInfo, device_info
from kernelops.ops.executor import Executor, Explanation, default_executor, set_default_executor
from kernelops.ops.keys import bucket
from kernelops.ops.operation import NotSupportedError, Operation
from kernelops.ops.params import BwdParams, DecodeParams, FwdParams
from kernelops.ops.pretuned import PretunedStore
from kernelops.ops.selectors import ConfigSelectorChain, config_overlay

__all__ = [
    "Autotuner", "AutotunePolicy", "BwdParams", "ConfigCache", "ConfigSelectorChain", "DecodeParams", "DeviceInfo",
    "Executor",
    "Explanation", "FwdParams", "NotSupportedError", "Operation", "PretunedStore", "TuneResult", "bucket",
    "config_overlay", "default_executor", "device_info", "set_default_executor",
]
