#!/usr/bin/env python3
"""Writes vllm_metrics.txt: a /metrics page shaped like vLLM 0.10's (V1
engine) for one model on one engine (no data parallelism), as served by prometheus_client
with prometheus-fastapi-instrumentator's http_* families. Metric names, types
and bucket boundaries follow vllm/v1/metrics/loggers.py (PrometheusStatLogger)
and docs/design/metrics.md in vllm-project/vllm; values are made up but
plausible. Run from this directory: python3 gen_vllm_page.py
"""
import random

random.seed(13)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ENGINES = ["0"]
out = []


def fam(name, typ, help_):
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} {typ}")


def lab(e, extra=""):
    s = f'engine="{e}",model_name="{MODEL}"'
    return "{" + (extra + "," if extra else "") + s + "}"


def gauge(name, help_, vals):
    fam(name, "gauge", help_)
    for e, v in zip(ENGINES, vals):
        out.append(f"{name}{lab(e)} {v}")


def counter(name, help_, base, extra=None):
    fam(name, "counter", help_)
    for e in ENGINES:
        for x in (extra or [""]):
            out.append(f"{name}_total{lab(e, x)} {float(base + random.randint(0, base // 3 + 1))}")
        # prometheus_client exports _created for counters
    for e in ENGINES:
        for x in (extra or [""]):
            out.append(f"{name}_created{lab(e, x)} 1.7330501e+09")


def hist(name, help_, buckets, scale):
    fam(name, "histogram", help_)
    for e in ENGINES:
        total = 5000 + random.randint(0, 500)
        acc = 0
        for b in buckets:
            acc = min(total, acc + random.randint(0, total // len(buckets) * 2))
            out.append(f'{name}_bucket{{engine="{e}",le="{float(b)}",model_name="{MODEL}"}} {float(acc)}')
        out.append(f'{name}_bucket{{engine="{e}",le="+Inf",model_name="{MODEL}"}} {float(total)}')
        out.append(f"{name}_count{lab(e)} {float(total)}")
        out.append(f"{name}_sum{lab(e)} {total * scale * random.random()}")
    fam(name + "_created", "gauge", help_)
    for e in ENGINES:
        out.append(f"{name}_created{lab(e)} 1.7330501e+09")


def buckets125(mx):
    out_, m = [], 1
    while True:
        for x in (1, 2, 5):
            if m * x > mx:
                return out_
            out_.append(m * x)
        m *= 10


# python_gc / process metrics, as prometheus_client serves them first.
fam("python_gc_objects_collected_total", "counter", "Objects collected during gc")
for g in range(3):
    out.append(f'python_gc_objects_collected_total{{generation="{g}"}} {float(random.randint(100, 90000))}')
fam("python_gc_objects_uncollectable_total", "counter", "Uncollectable objects found during GC")
for g in range(3):
    out.append(f'python_gc_objects_uncollectable_total{{generation="{g}"}} 0.0')
fam("python_gc_collections_total", "counter", "Number of times this generation was collected")
for g in range(3):
    out.append(f'python_gc_collections_total{{generation="{g}"}} {float(random.randint(10, 9000))}')
fam("python_info", "gauge", "Python platform information")
out.append('python_info{implementation="CPython",major="3",minor="12",patchlevel="11",version="3.12.11"} 1.0')
for n, t, h, v in [
    ("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", 9.8133516288e+10),
    ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", 4.218978304e+09),
    ("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", 1.73305009e+09),
    ("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", 8412.31),
    ("process_open_fds", "gauge", "Number of open file descriptors.", 112.0),
    ("process_max_fds", "gauge", "Maximum number of open file descriptors.", 1048576.0),
]:
    fam(n, t, h)
    out.append(f"{n} {v}")

# Scheduler state: what the router reads.
gauge("vllm:num_requests_running", "Number of requests in model execution batches.", [7.0])
gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", [3.0])
fam("vllm:lora_requests_info", "gauge", "Running stats on lora requests.")
out.append('vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.7330612e+09')
out.append('vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="tone-lora"} 1.7330613e+09')
out.append('vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7330611e+09')
gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", [0.4375])
counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", 8123456)
counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", 4123456)
counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", 12)
counter("vllm:prompt_tokens", "Number of prefill tokens processed.", 91234567)
counter("vllm:generation_tokens", "Number of generation tokens processed.", 21234567)
counter("vllm:request_success", "Count of successfully processed requests.", 51234,
        ['finished_reason="stop"', 'finished_reason="length"', 'finished_reason="abort"'])
MAXLEN = 131072
hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", buckets125(MAXLEN), 900)
hist("vllm:request_generation_tokens", "Number of generation tokens processed.", buckets125(MAXLEN), 300)
hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
     [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384], 60)
hist("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", buckets125(MAXLEN), 1000)
hist("vllm:request_params_n", "Histogram of the n request parameter.", [1, 2, 5, 10, 20], 1)
hist("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", buckets125(MAXLEN), 1000)
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
LAT = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT, 0.2)
hist("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", ITL, 0.03)
hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL, 0.03)
hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LAT, 6)
hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", LAT, 0.1)
hist("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", LAT, 6)
hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", LAT, 0.2)
hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", LAT, 6)
fam("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
out.append('vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="27648",num_gpu_blocks_override="None",prefix_caching_hash_algo="builtin",sliding_window="None",swap_space="4",swap_space_bytes="4294967296"} 1.0')

# prometheus-fastapi-instrumentator, per handler/method/status.
handlers = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/tokenize", "/load"]
fam("http_requests_total", "counter", "Total number of requests by method, status and handler.")
for h in handlers:
    for st in ("2xx", "4xx"):
        out.append(f'http_requests_total{{handler="{h}",method="{"GET" if h in ("/v1/models","/health","/metrics","/load") else "POST"}",status="{st}"}} {float(random.randint(1, 900000))}')
for n, bs in [("http_request_size_bytes", None), ("http_response_size_bytes", None)]:
    fam(n, "summary", "Content length of incoming requests by handler. Only value of header is respected.")
    for h in handlers:
        out.append(f'{n}_count{{handler="{h}"}} {float(random.randint(1, 900000))}')
        out.append(f'{n}_sum{{handler="{h}"}} {float(random.randint(1, 900000000))}')
fam("http_request_duration_highr_seconds", "histogram", "Latency with many buckets but no API specific labels. Made for more accurate percentile calculations.")
HB = [0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 7.5, 10.0, 30.0, 60.0]
acc = 0
for b in HB:
    acc += random.randint(0, 40000)
    out.append(f'http_request_duration_highr_seconds_bucket{{le="{b}"}} {float(acc)}')
out.append(f'http_request_duration_highr_seconds_bucket{{le="+Inf"}} {float(acc)}')
out.append(f"http_request_duration_highr_seconds_count {float(acc)}")
out.append(f"http_request_duration_highr_seconds_sum {acc * 0.7}")
fam("http_request_duration_seconds", "histogram", "Latency with only few buckets by handler. Made to be only used if aggregation by handler is important.")
for h in handlers:
    m = "GET" if h in ("/v1/models", "/health", "/metrics", "/load") else "POST"
    acc = 0
    for b in (0.1, 0.5, 1.0):
        acc += random.randint(0, 40000)
        out.append(f'http_request_duration_seconds_bucket{{handler="{h}",le="{b}",method="{m}"}} {float(acc)}')
    out.append(f'http_request_duration_seconds_bucket{{handler="{h}",le="+Inf",method="{m}"}} {float(acc)}')
    out.append(f'http_request_duration_seconds_count{{handler="{h}",method="{m}"}} {float(acc)}')
    out.append(f'http_request_duration_seconds_sum{{handler="{h}",method="{m}"}} {acc * 0.7}')

with open("vllm_metrics.txt", "w") as f:
    f.write("\n".join(out) + "\n")
