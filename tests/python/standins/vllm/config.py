"""vllm.config at v0.12: the parts of VllmConfig a stat logger reads."""
from dataclasses import dataclass, field
from typing import Optional, Protocol


class SupportsMetricsInfo(Protocol):
    def metrics_info(self) -> dict[str, str]: ...


@dataclass
class ModelConfig:
    model: str = "facebook/opt-125m"
    served_model_name: Optional[str] = None
    max_model_len: int = 2048

    def __post_init__(self):
        # vLLM resolves served_model_name to a str, the model's by default.
        if self.served_model_name is None:
            self.served_model_name = self.model


@dataclass
class CacheConfig:
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    num_gpu_blocks: Optional[int] = None
    num_cpu_blocks: Optional[int] = None

    def metrics_info(self) -> dict[str, str]:
        # vLLM's: every field, its value as str (the labels of
        # vllm:cache_config_info).
        return {k: str(v) for k, v in self.__dict__.items()}


@dataclass
class LoRAConfig:
    max_loras: int = 1


@dataclass
class SpeculativeConfig:
    num_speculative_tokens: int = 3


@dataclass
class ObservabilityConfig:
    show_hidden_metrics: bool = False
    kv_cache_metrics: bool = False
    cudagraph_metrics: bool = False


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    lora_config: Optional[LoRAConfig] = None
    speculative_config: Optional[SpeculativeConfig] = None
    observability_config: ObservabilityConfig = field(
        default_factory=ObservabilityConfig)
    kv_transfer_config: object = None
