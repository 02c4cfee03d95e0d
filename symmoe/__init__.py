"""symmoe: MoE expert-parallel dispatch and combine over GPU symmetric memory, one API,
interchangeable backends (host, torch, nvshmem, nccl)."""
from .buffer import Buffer
from .config import Config, load as load_config
from .errors import (BackendUnavailable, BuildError, CapacityError, ConfigError, ConfigMismatch, InputError,
                     NcclError, StallError, SymmoeError)
from .handle import DispatchHandle
from .memory import SymmetricMemory

__version__ = "0.1.0"
__all__ = ["Buffer", "Config", "load_config", "DispatchHandle", "SymmetricMemory", "SymmoeError", "ConfigError",
           "InputError", "CapacityError", "BackendUnavailable", "StallError", "ConfigMismatch", "BuildError", "NcclError"]
