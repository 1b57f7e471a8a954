"""cookbook/endpoint.py and the launcher's log parsing: /metrics and KV pool sizes."""
from cookbook.endpoint import kv_pool_from_metrics, metric_value, normalize_base_url, parse_metrics
from cookbook.launch import kv_pool_from_log

METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",enable_prefix_caching="True",kv_cache_size_tokens="93184",num_gpu_blocks="728"} 1.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1920.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 80.0
process_start_time_seconds 1.7646e+09
"""


def test_parse_metrics_and_values() -> None:
    metrics = parse_metrics(METRICS)
    assert metric_value(metrics, "vllm:prefix_cache_hits_total") == 2000.0
    assert metric_value(metrics, "vllm:prefix_cache_hits_total", engine="1") == 80.0
    assert metric_value(metrics, "process_start_time_seconds") == 1.7646e09
    assert metric_value(metrics, "nope") is None
    assert kv_pool_from_metrics(metrics) == 93184


def test_kv_pool_from_blocks_when_tokens_are_absent() -> None:
    metrics = parse_metrics('vllm:cache_config_info{block_size="128",num_gpu_blocks="10"} 1.0\n')
    assert kv_pool_from_metrics(metrics) == 1280


def test_kv_pool_from_log_lines() -> None:
    cpu = ["(EngineCore pid=1) INFO [kv_cache_utils.py:2327] CPU KV cache size: 93,184 tokens, Maximum concurrency"]
    gpu = ["INFO GPU KV cache size: 3,800,136 tokens, Maximum concurrency for 262,144 tokens per request: 14.50x"]
    gaudi = ["INFO hpu_worker.py: Usable num_blocks: 40603, actual allocated num_blocks: 40604"]
    assert kv_pool_from_log(cpu) == 93184
    assert kv_pool_from_log(gpu) == 3800136
    assert kv_pool_from_log(gaudi, block_size=128) == 40603 * 128
    assert kv_pool_from_log(gaudi) is None
    assert kv_pool_from_log(["nothing here"]) is None


def test_normalize_base_url() -> None:
    assert normalize_base_url("http://h:1/v1/") == "http://h:1"
    assert normalize_base_url("http://h:1") == "http://h:1"
