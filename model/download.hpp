#pragma once
// download_model: fetches a GPT-2 model folder (config.json, model.safetensors,
// vocab.json, merges.txt) from the Hugging Face Hub over HTTPS with libcurl.
#include <string>
#include <vector>

namespace troupe::model {

struct DownloadOptions {
  // Hub base URL; "" = $TROUPE_HF_ENDPOINT when set, else https://huggingface.co.
  std::string endpoint;
  // Git revision of the model repository (branch, tag or commit).
  std::string revision = "main";
  // Seconds to wait for a connection to be set up; 0 = libcurl's default (300).
  long connect_timeout_s = 10;
  // Abort a transfer that moves under 1 KB/s for this many seconds; 0 = never.
  long stall_timeout_s = 60;
  // Draw a progress bar (bytes, MB/s, %) on stderr.
  bool progress = true;
};

// The model names download_model accepts: GPT-2's Hub repositories.
std::vector<std::string> downloadable_models();

// The URL of one file of a model: <endpoint>/<name>/resolve/<revision>/<file>.
std::string hub_file_url(const std::string& endpoint, const std::string& name,
                         const std::string& revision, const std::string& file);

// Downloads the four files of `name` ("gpt2", "gpt2-medium", "gpt2-large",
// "gpt2-xl", optionally as "openai-community/<name>") into `to_dir` (created
// when absent). Each file is written to <file>.part and renamed when complete:
// its size must match Content-Length, and model.safetensors must hash to the
// sha256 the Hub sends in X-Linked-Etag/ETag (when it sends one). Files
// already there are replaced. Throws std::invalid_argument for an unknown
// name and std::runtime_error on any network or check failure; the message
// lists the URLs to fetch by hand and the `troupe init-model` fallback, and no
// .part file is left behind.
void download_model(const std::string& name, const std::string& to_dir,
                    const DownloadOptions& options = {});

}  // namespace troupe::model
