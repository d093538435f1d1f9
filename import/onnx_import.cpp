// OnnxModel: loading a file (mapped, its initializers' data left in place), parsing, building
// the forward graph through the importer core, and writing trained values back.
#include "memplan/import/onnx_import.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string_view>

#include <sys/mman.h>

#include "memplan/common/input_file.h"
#include "memplan/import/onnx_importer.h"
#include "memplan/import/onnx_model.h"
#include "memplan/import/onnx_wire.h"

namespace memplan::import {

namespace {

// Protobuf refuses messages past 2 GiB; so does the reader, before reading them.
constexpr Bytes kMaxOnnxBytes = (Bytes{1} << 31) - 1;

// Parses `bytes` (kept alive by `storage`) with the initializers' data left in place.
Result<std::unique_ptr<OnnxModel::Impl>> parse_model(std::string_view bytes, std::shared_ptr<const void> storage,
                                                     const std::string& source) {
  auto impl = std::make_unique<OnnxModel::Impl>();
  const Error corrupt{source + ": not a valid ONNX model (the protobuf does not parse: a truncated or corrupt file?)"};
  if (bytes.size() > static_cast<std::size_t>(kMaxOnnxBytes)) return corrupt;
  std::string stripped;
  std::vector<std::string_view> raw;
  if (strip_initializer_data(bytes, stripped, raw) &&
      impl->model.ParseFromArray(stripped.data(), static_cast<int>(stripped.size())) &&
      impl->model.graph().initializer_size() == static_cast<int>(raw.size())) {
    impl->raw = std::move(raw);
    impl->storage = std::move(storage);
    return impl;
  }
  impl->model.Clear();
  if (!impl->model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return corrupt;
  return impl;
}

// Maps `path` read-only (kept mapped while `storage` lives); an empty file maps to nothing.
Result<std::string_view> map_file(const std::string& path, Bytes max_bytes, std::string_view what,
                                  std::shared_ptr<const void>& storage) {
  auto file = InputFile::open(path, max_bytes, what);
  if (!file) return file.error();
  const auto size = static_cast<std::size_t>(file.value().size());
  if (size == 0) return std::string_view();
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.value().fd(), 0);
  if (mapped == MAP_FAILED) return Error{path + ": cannot map the file into memory: " + std::strerror(errno)};
  storage = std::shared_ptr<const void>(mapped, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  return std::string_view(static_cast<const char*>(mapped), size);
}

// ONNX's external data: an initializer whose bytes lie in a file named by its `location`
// (relative to the model's directory, never leaving it), from `offset` for `length` bytes.
// Each such file is mapped once; the model's raw views point into the mappings, so planning
// still reads no weight and training reads them from the page cache.
Status map_external_data(OnnxModel::Impl& impl, const std::string& model_path) {
  const auto& initializers = impl.model.graph().initializer();
  bool any = false;
  for (const onnx::TensorProto& t : initializers) any = any || t.data_location() == onnx::TensorProto::EXTERNAL;
  if (!any) return Status::success();
  if (impl.raw.empty()) {
    for (const onnx::TensorProto& t : initializers) impl.raw.emplace_back(t.raw_data());
  }
  const std::filesystem::path dir = std::filesystem::path(model_path).parent_path();
  std::map<std::string, std::string_view> mapped;
  for (int i = 0; i < initializers.size(); ++i) {
    const onnx::TensorProto& t = initializers.Get(i);
    if (t.data_location() != onnx::TensorProto::EXTERNAL) continue;
    const std::string what = model_path + ": initializer '" + t.name() + "' ";
    std::string location;
    std::uint64_t offset = 0;
    std::optional<std::uint64_t> length;
    for (const auto& entry : t.external_data()) {
      if (entry.key() == "location") {
        location = entry.value();
      } else if (entry.key() == "offset" || entry.key() == "length") {
        std::uint64_t v = 0;
        const auto [end, ec] = std::from_chars(entry.value().data(), entry.value().data() + entry.value().size(), v);
        if (ec != std::errc{} || end != entry.value().data() + entry.value().size()) {
          return Error{what + "has external data " + entry.key() + " '" + entry.value().substr(0, 40) + "', not a byte count"};
        }
        (entry.key() == "offset" ? offset : length.emplace()) = v;
      }
    }
    const std::filesystem::path relative(location);
    bool escapes = location.empty() || relative.is_absolute();
    for (const auto& part : relative) escapes = escapes || part == "..";
    if (escapes) {
      return Error{what + "keeps its data at '" + location + "'; memplan reads external data from files beside the model "
                   "(a relative path that stays in its directory)"};
    }
    auto it = mapped.find(location);
    if (it == mapped.end()) {
      impl.external_files.emplace_back();
      auto bytes = map_file((dir / relative).string(), Bytes{1} << 42, "ONNX external data file", impl.external_files.back());
      if (!bytes) return Error{what + "keeps its data in an external file: " + bytes.error().message};
      it = mapped.emplace(location, bytes.value()).first;
    }
    const std::string_view file = it->second;
    const std::uint64_t n = length.value_or(offset <= file.size() ? file.size() - offset : 0);
    if (offset > file.size() || n > file.size() - offset) {
      return Error{what + "reads bytes [" + std::to_string(offset) + ", " + std::to_string(offset + n) + ") of '" + location +
                   "', which holds " + std::to_string(file.size()) + " (a truncated file?)"};
    }
    impl.raw[static_cast<std::size_t>(i)] = file.substr(offset, n);
  }
  return Status::success();
}

}  // namespace

OnnxModel::OnnxModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OnnxModel::~OnnxModel() = default;

std::int64_t OnnxModel::opset() const { return impl_->opset; }
const std::string& OnnxModel::source() const { return impl_->source; }

Result<std::shared_ptr<const OnnxModel>> OnnxModel::load(const std::string& path) {
  // InputFile refuses what is not a regular file or is too large. The file is mapped, not read:
  // protobuf parses it without the initializers' data, which stays in the mapping (in the page
  // cache) until an import asks for the values; planning never does (a ViT-B is 350 MB of them).
  std::shared_ptr<const void> storage;
  auto bytes = map_file(path, kMaxOnnxBytes, "ONNX model", storage);
  if (!bytes) return bytes.error();
  if (bytes.value().empty()) return parse(std::string_view(), path);
  auto impl = parse_model(bytes.value(), storage, path);
  if (!impl) return impl.error();
  if (Status s = map_external_data(*impl.value(), path); !s) return s.error();
  return finish(std::move(impl).value(), path);
}

Result<std::shared_ptr<const OnnxModel>> OnnxModel::parse(std::string_view bytes, const std::string& source) {
  auto copy = std::make_shared<const std::string>(bytes);  // the initializers' data stays in it
  auto impl = parse_model(*copy, copy, source);
  if (!impl) return impl.error();
  return finish(std::move(impl).value(), source);
}

Result<std::shared_ptr<const OnnxModel>> OnnxModel::finish(std::unique_ptr<Impl> impl, const std::string& source) {
  impl->source = source;
  if (!impl->model.has_graph()) return Error{source + ": the ONNX model has no graph"};
  for (const auto& op : impl->model.opset_import()) {
    if (op.domain().empty() || op.domain() == "ai.onnx") impl->opset = op.version();
  }
  if (impl->opset == 0) return Error{source + ": the ONNX model imports no opset of the default domain"};
  return std::shared_ptr<const OnnxModel>(std::make_shared<OnnxModel>(std::move(impl)));
}

ImportedGraph OnnxModel::build(const ImportOptions& options) const { return Importer(*impl_, options).run(); }

Result<ImportedGraph> OnnxModel::try_build(const ImportOptions& options) const {
  try {
    return build(options);
  } catch (const graph::GraphError& e) {
    return Error{e.what()};
  }
}

Result<std::string> OnnxModel::with_initializers(const std::vector<std::pair<std::string, std::vector<float>>>& values) const {
  onnx::ModelProto copy = impl_->model;
  std::map<std::string, const std::vector<float>*> by_name;
  for (const auto& [name, v] : values) by_name[name] = &v;
  std::size_t replaced = 0;
  for (int i = 0; i < copy.graph().initializer_size(); ++i) {
    onnx::TensorProto& t = *copy.mutable_graph()->mutable_initializer(i);
    auto it = by_name.find(t.name());
    if (it == by_name.end()) {
      if (!impl_->raw.empty() && !impl_->raw[static_cast<std::size_t>(i)].empty()) {
        t.set_raw_data(std::string(impl_->raw[static_cast<std::size_t>(i)]));  // the file's values, unchanged
        t.clear_external_data();  // written inside the model, as every value memplan writes
        t.set_data_location(onnx::TensorProto::DEFAULT);
      }
      continue;
    }
    if (t.data_type() != onnx::TensorProto::FLOAT) return Error{"initializer '" + t.name() + "' is not float"};
    std::int64_t n = 1;
    for (std::int64_t d : t.dims()) n *= d;
    if (static_cast<std::int64_t>(it->second->size()) != n) {
      return Error{"initializer '" + t.name() + "' has " + std::to_string(n) + " elements, the trained tensor " + std::to_string(it->second->size())};
    }
    t.clear_float_data();
    t.clear_external_data();
    t.set_data_location(onnx::TensorProto::DEFAULT);
    t.set_raw_data(std::string(reinterpret_cast<const char*>(it->second->data()), it->second->size() * sizeof(float)));
    ++replaced;
  }
  if (replaced != by_name.size()) return Error{"some trained tensors name no initializer of " + impl_->source};
  std::string out;
  if (copy.ByteSizeLong() > static_cast<std::size_t>(kMaxOnnxBytes)) {
    return Error{"the trained model is " + std::to_string(copy.ByteSizeLong()) + " bytes with its weights inside, over protobuf's 2 GiB; "
                 "memplan writes ONNX files with the weights inside (save the weights with --save-dir instead)"};
  }
  if (!copy.SerializeToString(&out)) return Error{"cannot serialize the ONNX model"};
  return out;
}

}  // namespace memplan::import
