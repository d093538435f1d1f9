#include "fuzz/targets.h"

#include <algorithm>
#include <string>

#include "memplan/common/byte_size.h"
#include "memplan/common/check.h"
#include "memplan/graph/tensor.h"
#include "memplan/import/onnx_import.h"
#include "memplan/models/fashion_mnist.h"
#include "memplan/models/hf_config.h"
#include "memplan/models/text_dataset.h"
#include "memplan/planner/allocation_problem.h"
#include "memplan/planner/exact_solver.h"
#include "memplan/planner/greedy_solver.h"
#include "memplan/planner/minimalloc_csv.h"
#include "memplan/planner/validator.h"
#include "memplan/runtime/caching_allocator.h"
#include "memplan/runtime/safetensors.h"
#include "memplan/runtime/weights.h"
#include "memplan/trace/memory_snapshot.h"
#include "memplan/trace/snapshot_replay.h"
#include "memplan/train/language_model.h"

namespace memplan::fuzz {
namespace {

std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Reads the input front to back; past the end every read is 0, so any input decodes.
class ByteReader {
 public:
  ByteReader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() { return u16() | (std::uint32_t{u16()} << 16); }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

void check_solution(const planner::AllocationProblem& problem, const planner::Solution& solution,
                    const char* solver) {
  if (!solution.has_packing()) return;
  const Status valid = planner::validate_solution(problem, solution);
  MEMPLAN_CHECK(valid.ok(), solver << " returned an invalid plan: " << valid.error().message);
  MEMPLAN_CHECK(solution.height_bytes >= planner::lower_bound_bytes(problem),
                solver << " height " << solution.height_bytes << " is below the lower bound");
}

}  // namespace

void fuzz_byte_size(const std::uint8_t* data, std::size_t size) {
  const Result<Bytes> parsed = parse_byte_size(as_text(data, size));
  if (!parsed) {
    MEMPLAN_CHECK(!parsed.error().message.empty());
    return;
  }
  const Bytes bytes = parsed.value();
  MEMPLAN_CHECK(bytes >= 1 && bytes < (Bytes{1} << 62), "accepted size " << bytes << " out of range");
  const Result<Bytes> again = parse_byte_size(std::to_string(bytes));
  MEMPLAN_CHECK(again.ok() && again.value() == bytes, "byte count " << bytes << " does not parse back to itself");
}

void fuzz_minimalloc_csv(const std::uint8_t* data, std::size_t size) {
  auto parsed = planner::parse_minimalloc_csv(as_text(data, size), "fuzz.csv");
  if (!parsed) {
    MEMPLAN_CHECK(parsed.error().message.rfind("fuzz.csv:", 0) == 0, "message does not name the input: "
                                                                         << parsed.error().message);
    return;
  }
  const planner::MinimallocCsv& csv = parsed.value();
  const Status checked = planner::check_problem(csv.problem);
  MEMPLAN_CHECK(checked.ok(), "a parsed CSV fails check_problem: " << checked.error().message);
  const std::size_t n = csv.problem.buffers.size();
  MEMPLAN_CHECK(!csv.offsets || csv.offsets->size() == n);
  const std::vector<Offset> offsets = csv.offsets ? *csv.offsets : std::vector<Offset>(n, 0);
  auto text = planner::format_minimalloc_csv(csv.problem, offsets);
  if (text) {
    auto again = planner::parse_minimalloc_csv(text.value(), "again.csv");
    MEMPLAN_CHECK(again.ok(), "written CSV does not parse: " << again.error().message);
    const auto& b2 = again.value().problem.buffers;
    MEMPLAN_CHECK(b2.size() == n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& a = csv.problem.buffers[i];
      MEMPLAN_CHECK(a.id == b2[i].id && a.first_op == b2[i].first_op && a.end_op == b2[i].end_op &&
                        a.size_bytes == b2[i].size_bytes && offsets[i] == (*again.value().offsets)[i],
                    "buffer " << i << " changed in a CSV round trip");
    }
  }
  if (n <= 64) check_solution(csv.problem, planner::solve_greedy(csv.problem), "greedy");
}

void fuzz_idx(const std::uint8_t* data, std::size_t size) {
  // The first 4 bytes choose where the image file ends and the label file begins.
  ByteReader reader(data, size);
  const std::size_t rest = size >= 4 ? size - 4 : 0;
  const std::size_t split = rest == 0 ? 0 : reader.u32() % (rest + 1);
  const std::uint8_t* body = data + (size - rest);
  const std::vector<std::uint8_t> images(body, body + split);
  const std::vector<std::uint8_t> labels(body + split, body + rest);
  auto parsed = models::parse_idx_pair(images, labels, "images.idx", "labels.idx");
  if (!parsed) return;
  const models::ImageDataset& ds = parsed.value();
  MEMPLAN_CHECK(ds.count > 0 && ds.rows > 0 && ds.cols > 0);
  MEMPLAN_CHECK(ds.images.size() == static_cast<std::size_t>(ds.count * ds.features()));
  MEMPLAN_CHECK(ds.labels.size() == static_cast<std::size_t>(ds.count));
  for (float pixel : ds.images) MEMPLAN_CHECK(pixel >= 0.0f && pixel <= 1.0f);
  for (std::int32_t label : ds.labels) MEMPLAN_CHECK(label >= 0 && label < ds.classes);
}

void fuzz_safetensors(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes = as_text(data, size);
  auto parsed = runtime::parse_safetensors(bytes, "fuzz.safetensors");
  if (parsed) {
    const runtime::SafetensorsView& view = parsed.value();
    for (const runtime::SafetensorsEntry& t : view.tensors) {
      MEMPLAN_CHECK(t.data.data() >= bytes.data() && t.data.data() + t.data.size() <= bytes.data() + bytes.size(),
                    "tensor '" << t.name << "' points outside the file");
      std::int64_t numel = 1;
      for (std::int64_t d : t.shape) {
        MEMPLAN_CHECK(d >= 0, "tensor '" << t.name << "' has a negative dimension " << d);
        numel = d == 0 ? 0 : numel * d;  // d <= data size when numel > 0, so this cannot overflow
      }
      MEMPLAN_CHECK(static_cast<std::uint64_t>(numel * graph::dtype_size(t.dtype)) == t.data.size());
    }
    // What read_weights_file checks before reading the data agrees with the full parse.
    std::uint64_t header_len = 0;
    for (int i = 0; i < 8; ++i) header_len |= std::uint64_t(data[i]) << (8 * i);
    auto announced = runtime::safetensors_announced_data_bytes(bytes.substr(8, header_len), "fuzz.safetensors");
    MEMPLAN_CHECK(announced.ok() && announced.value() == size - 8 - header_len,
                  "a file that parses announces " << (announced.ok() ? announced.value() : 0) << " data bytes");
    auto encoded = runtime::encode_safetensors(view.tensors, view.metadata);
    MEMPLAN_CHECK(encoded.ok(), "a parsed file cannot be written back: " << encoded.error().message);
    auto again = runtime::parse_safetensors(encoded.value(), "again.safetensors");
    MEMPLAN_CHECK(again.ok(), "a written file does not parse: " << again.error().message);
    MEMPLAN_CHECK(again.value().metadata == view.metadata);
    MEMPLAN_CHECK(again.value().tensors.size() == view.tensors.size());
    for (const runtime::SafetensorsEntry& t : view.tensors) {
      const runtime::SafetensorsEntry* u = again.value().find(t.name);
      MEMPLAN_CHECK(u != nullptr && u->dtype == t.dtype && u->shape == t.shape && u->data == t.data,
                    "tensor '" << t.name << "' changed in a round trip");
    }
    (void)train::parse_gpt_metadata(view.metadata, "fuzz.safetensors");
    (void)train::parse_decoder_metadata(view.metadata, "fuzz.safetensors");  // a saved config's text, context, vocabulary
  }
  (void)runtime::parse_weights_file(std::string(bytes), "fuzz.safetensors");
}

void fuzz_solver(const std::uint8_t* data, std::size_t size) {
  ByteReader in(data, size);
  const int n = 1 + in.u8() % 12;
  const std::uint8_t mode = in.u8();
  // Size scale: small (exercises packing), or huge (sizes near the 2^60 limit: overflow checks).
  const int shift = (mode & 0x06) == 0x06 ? 44 : (mode & 0x06) == 0x04 ? 12 : 0;
  planner::AllocationProblem problem;
  for (int i = 0; i < n; ++i) {
    planner::BufferSpec b;
    b.id = "b" + std::to_string(i);
    b.size_bytes = std::min<Bytes>(Bytes{in.u16()} << shift, Bytes{1} << 60);
    const std::uint8_t shape = in.u8();
    b.alignment = Bytes{1} << (shape % 8);
    b.first_op = in.u8() % 16;
    b.end_op = b.first_op + 1 + (shape >> 3) % 8;
    if ((mode & 0x08) != 0 && (shape & 0x80) != 0) {
      b.fixed_offset = align_up(Bytes{in.u16()} << shift, b.alignment);
    }
    problem.buffers.push_back(std::move(b));
  }
  if ((mode & 0x01) != 0) problem.capacity_bytes = std::min<Bytes>(Bytes{in.u32()} << shift, Bytes{1} << 60);
  if (!planner::check_problem(problem)) return;

  const planner::Solution greedy = planner::solve_greedy(problem);
  check_solution(problem, greedy, "greedy");
  MEMPLAN_CHECK(problem.capacity_bytes || greedy.has_packing(), "greedy found no packing without a capacity");

  planner::ExactSolverOptions options;
  options.time_limit_s = 0.0;  // the node limit alone bounds the search, so runs are repeatable
  options.node_limit = 2000;
  const planner::Solution exact = planner::solve_exact(problem, options);
  check_solution(problem, exact, "exact");
  if (exact.status == planner::SolveStatus::not_found) {
    MEMPLAN_CHECK(!greedy.has_packing(), "exact solver proved no packing fits, but greedy found one of height "
                                             << greedy.height_bytes);
  }
  if (exact.has_packing() && greedy.has_packing() && !problem.capacity_bytes) {
    MEMPLAN_CHECK(exact.height_bytes <= greedy.height_bytes, "exact solver packed higher than greedy");
  }
}

void fuzz_alloc_conf(const std::uint8_t* data, std::size_t size) {
  auto parsed = runtime::CachingAllocatorOptions::parse(as_text(data, size));
  if (!parsed) return;
  const std::string text = parsed.value().to_string();
  auto again = runtime::CachingAllocatorOptions::parse(text);
  MEMPLAN_CHECK(again.ok(), "'" << text << "' written by to_string() does not parse: " << again.error().message);
  MEMPLAN_CHECK(again.value().to_string() == text, "'" << text << "' changes in a round trip");
}

void fuzz_text(const std::uint8_t* data, std::size_t size) {
  ByteReader in(data, size);
  const std::int64_t min_tokens = 2 + in.u8() % 8;
  const std::string text(as_text(data, size).substr(std::min<std::size_t>(size, 1)));
  auto parsed = models::make_text_dataset(text, min_tokens);
  if (!parsed) return;
  const models::TextDataset& ds = parsed.value();
  MEMPLAN_CHECK(std::is_sorted(ds.vocab.begin(), ds.vocab.end()) &&
                std::adjacent_find(ds.vocab.begin(), ds.vocab.end()) == ds.vocab.end());
  MEMPLAN_CHECK(ds.decode(ds.train) + ds.decode(ds.val) == text, "encoding does not decode back to the text");
  std::vector<std::int32_t> x, labels;
  models::sample_text_batch(ds.train, 2, min_tokens - 1, 1, 0, x, labels);
  for (std::int32_t id : x) MEMPLAN_CHECK(id >= 0 && id < ds.vocab_size());
  for (std::int32_t id : labels) MEMPLAN_CHECK(id >= 0 && id < ds.vocab_size());
}

// A PyTorch memory snapshot: the whitelisting unpickler, the schema, the start state and the
// replay. Whatever is accepted must replay with a static plan no lower than its lower bound.
void fuzz_snapshot(const std::uint8_t* data, std::size_t size) {
  auto snapshot = trace::parse_memory_snapshot(as_text(data, size), "fuzz.pickle");
  if (!snapshot) return;
  trace::SnapshotReplayRequest request;
  request.solver_nodes = 2000;
  request.top_sites = 3;
  auto replay = trace::replay_snapshot(snapshot.value(), request);
  if (!replay) return;
  const trace::SnapshotReplay& r = replay.value();
  MEMPLAN_CHECK(r.planned_arena_bytes >= r.live_peak_bytes, "static plan below its lower bound");
  MEMPLAN_CHECK(r.fidelity.placements_matched <= r.fidelity.placements_compared, "more matches than comparisons");
}

void fuzz_onnx(const std::uint8_t* data, std::size_t size) {
  auto model = import::OnnxModel::parse(as_text(data, size), "fuzz.onnx");
  if (!model) return;
  import::ImportOptions options;
  options.batch = 2;
  auto built = model.value()->try_build(options);  // an Error is a refusal; anything else thrown is a bug
  if (!built) return;
  const graph::Graph& g = built.value().graph;
  MEMPLAN_CHECK(g.loss != kNoTensor && g.output != kNoTensor, "an imported graph without a loss or an output");
  for (const auto& [id, values] : built.value().initial_values) {
    MEMPLAN_CHECK(static_cast<std::int64_t>(values.size()) == g.tensor(id).shape.numel(),
                  "initial values of '" << g.tensor(id).name << "' do not match its shape");
  }
}

// A Hugging Face config.json: whatever the reader accepts describes itself and, at a size small
// enough to build here, builds its graph or refuses with a GraphError (never another exception).
void fuzz_hf_config(const std::uint8_t* data, std::size_t size) {
  auto config = models::parse_hf_config(as_text(data, size), "fuzz/config.json");
  if (!config) return;
  const models::HfConfig& c = config.value();
  MEMPLAN_CHECK(!c.describe().empty(), "an accepted config without a description");
  const std::int64_t layers = std::max({c.gpt.layers, c.llama.layers, c.bert.encoder.layers, c.vit.encoder.layers});
  const std::int64_t width = std::max({c.gpt.width, c.llama.width, c.bert.encoder.width, c.vit.encoder.width});
  if (layers > 4 || width > 256 || c.llama.ffn > 1024 || c.llama.vocab > 4096 || c.gpt.vocab > 4096 ||
      c.bert.vocab > 4096 || c.image_size > 64) {
    return;
  }
  models::ZooOptions options;
  options.seq = 4;
  try {
    const graph::Graph g = models::build_hf_forward(c, 1, options);
    MEMPLAN_CHECK(g.loss != kNoTensor, "a built config without a loss");
  } catch (const graph::GraphError&) {
    // a refusal the builder words; anything else escapes as a bug
  }
}

}  // namespace memplan::fuzz
