#pragma once
// The flags of the commands that load a model (troupe-engine's only).
#include <string>

#include <c10/core/Device.h>
#include <CLI/CLI.hpp>

namespace troupe::cli {

// "cpu", "cuda", "cuda:1" -> a device; std::invalid_argument on junk or when CUDA is absent.
c10::Device parse_device(const std::string& text);
// --dtype float32|bfloat16 and --quantization none|int8 (vLLM's flags): the
// weight matrices' storage, into `dtype` as parse_weight_dtype's names
// ("int8" when quantized; with --dtype bfloat16 a usage error).
void add_dtype_flags(CLI::App* sub, std::string& dtype);
// --kv-cache-dtype auto|float32|bfloat16 (vLLM's flag): the KV cache's
// storage; auto = the weights' (model::parse_kv_cache_dtype).
void add_kv_cache_dtype_flag(CLI::App* sub, std::string& kv_cache_dtype);

}  // namespace troupe::cli
