// Fuzz entry points: one function per untrusted-input parser (and the solvers), each taking raw
// bytes. They return normally when the input was handled (accepted or refused with an Error) and
// throw memplan::InternalError (a failed MEMPLAN_CHECK) when an invariant broke: an accepted
// input that does not round-trip, or a plan the validator rejects. libFuzzer drives them from
// fuzz/fuzzer_main.cpp; tests/fuzz_corpus_test.cpp replays the committed corpora through them.
// fuzz_cli and targets() are in cli_target.cpp (library memplan_fuzz_cli, the only one that links
// the CLI); the others in targets.cpp (memplan_fuzz_targets, the libraries whose parsers they feed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace memplan::fuzz {

using Entry = void (*)(const std::uint8_t* data, std::size_t size);

struct Target {
  std::string_view name;  // also the corpus folder: fuzz/corpus/<name>/
  Entry entry;
};

// Every target, in a fixed order.
const std::vector<Target>& targets();

void fuzz_byte_size(const std::uint8_t* data, std::size_t size);
void fuzz_minimalloc_csv(const std::uint8_t* data, std::size_t size);
void fuzz_idx(const std::uint8_t* data, std::size_t size);
void fuzz_safetensors(const std::uint8_t* data, std::size_t size);
void fuzz_cli(const std::uint8_t* data, std::size_t size);
void fuzz_solver(const std::uint8_t* data, std::size_t size);
void fuzz_alloc_conf(const std::uint8_t* data, std::size_t size);
void fuzz_text(const std::uint8_t* data, std::size_t size);
void fuzz_snapshot(const std::uint8_t* data, std::size_t size);
void fuzz_onnx(const std::uint8_t* data, std::size_t size);
void fuzz_hf_config(const std::uint8_t* data, std::size_t size);

}  // namespace memplan::fuzz
