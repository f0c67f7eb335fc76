// hsx_mooncake_put 'MOONCAKE_CONFIG_JSON': hsx's Mooncake capture sink driven from stdin,
// for tests/python/test_mooncake_sink.py, until the server and extract reach it through
// MakeCaptureSink. One JSON command a line, one JSON answer a line on stdout:
//   {"op": "put", "id": ID, "file": PATH}  puts the hidden_states and token_ids of a file
//        sink's safetensors file -> {"location": KEY, "transfer_params": MANIFEST} or {"error": ...}
//   {"op": "fail", "id": ID, "why": TEXT}  PutFailure -> {"ok": true}
// The objects live in this process's Mooncake segment, so it stays up until stdin closes.
// A start-up error exits 1 with the message on stderr.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "capture/mooncake_sink.h"
#include "tensor/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: hsx_mooncake_put MOONCAKE_CONFIG_JSON\n");
    return 2;
  }
  auto config = nlohmann::json::parse(argv[1], nullptr, false);
  auto sink = hsx::MakeMooncakeSink(config);
  if (!sink.ok()) {
    std::fprintf(stderr, "hsx_mooncake_put: %s\n", sink.status().message().c_str());
    return 1;
  }
  std::cout << nlohmann::json{{"ready", (*sink)->Describe()}}.dump() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    auto cmd = nlohmann::json::parse(line, nullptr, false);
    nlohmann::json answer;
    hsx::CaptureRecord record;
    record.id = cmd.value("id", "");
    if (cmd.value("op", "") == "put") {
      auto file = hsx::SafetensorsFile::Open(cmd.value("file", ""));
      if (!file.ok()) {
        answer = {{"error", file.status().message()}};
      } else {
        record.hidden_states = file->Get("hidden_states").value();
        hsx::Tensor ids = file->Get("token_ids").value();
        for (int64_t i = 0; i < ids.numel(); ++i) {
          int64_t v;
          std::memcpy(&v, static_cast<const char*>(ids.raw()) + i * 8, 8);
          record.token_ids.push_back(static_cast<int32_t>(v));
        }
        record.metadata = file->metadata();
        auto receipt = (*sink)->Put(record);
        answer = receipt.ok() ? nlohmann::json{{"location", receipt->location}, {"transfer_params", receipt->transfer_params}}
                              : nlohmann::json{{"error", receipt.status().message()}};
      }
    } else if (cmd.value("op", "") == "fail") {
      const hsx::Status marked = (*sink)->PutFailure(record, hsx::Error(cmd.value("why", "")));
      answer = marked.ok() ? nlohmann::json{{"ok", true}} : nlohmann::json{{"error", marked.message()}};
    } else {
      answer = {{"error", "unknown command: " + line}};
    }
    std::cout << answer.dump() << std::endl;
  }
  return 0;
}
