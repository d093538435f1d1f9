#include "memplan/trace/memory_snapshot.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <unordered_map>

#include "memplan/common/input_file.h"
#include "memplan/trace/pickle.h"

namespace memplan::trace {

std::string_view snapshot_action_name(SnapshotAction action) {
  switch (action) {
    case SnapshotAction::alloc: return "alloc";
    case SnapshotAction::free_requested: return "free_requested";
    case SnapshotAction::free_completed: return "free_completed";
    case SnapshotAction::segment_alloc: return "segment_alloc";
    case SnapshotAction::segment_free: return "segment_free";
    case SnapshotAction::segment_map: return "segment_map";
    case SnapshotAction::segment_unmap: return "segment_unmap";
    case SnapshotAction::oom: return "oom";
    case SnapshotAction::snapshot: return "snapshot";
  }
  return "?";
}

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Paths of installed packages and the standard library: not where a user's allocation starts.
bool is_library_path(std::string_view file) {
  for (std::string_view marker : {"/site-packages/", "/dist-packages/", "/lib/python", "/torch/", "<frozen"}) {
    if (file.find(marker) != std::string_view::npos) return true;
  }
  return false;
}

}  // namespace

MemorySnapshot cut_snapshot(const MemorySnapshot& snapshot, int device, std::size_t first) {
  MemorySnapshot cut = snapshot;
  if (device >= 0 && static_cast<std::size_t>(device) < cut.device_traces.size()) {
    std::vector<SnapshotEvent>& events = cut.device_traces[static_cast<std::size_t>(device)];
    events.erase(events.begin(), events.begin() + static_cast<std::ptrdiff_t>(std::min(first, events.size())));
  }
  return cut;
}

std::optional<std::size_t> user_frame_index(const std::vector<StackFrame>& frames) {
  std::optional<std::size_t> any_python;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const std::string_view file = frames[i].filename;
    if (!ends_with(file, ".py")) continue;
    if (!is_library_path(file)) return i;
    if (!any_python) any_python = i;
  }
  return any_python;
}

namespace {

// Walks the unpickled value with a path for messages: "device_traces[0][12].size".
class SchemaReader {
 public:
  SchemaReader(const PickleDocument& doc, std::string_view source) : doc_(doc), source_(source) {}

  Result<MemorySnapshot> read() {
    const PyValue& root = doc_.root();
    if (root.kind() != PyKind::dict) {
      return error("", "the file holds a " + std::string(py_kind_name(root.kind())) +
                           ", not the dict torch.cuda.memory._dump_snapshot() writes");
    }
    MemorySnapshot out;
    const PyValue* segments = doc_.find(root, "segments");
    if (segments == nullptr) return error("", "no 'segments' key: not a PyTorch memory snapshot");
    const PyValue* traces = doc_.find(root, "device_traces");
    if (traces == nullptr) {
      return error("", "no 'device_traces' key: the snapshot was taken without "
                       "torch.cuda.memory._record_memory_history(), so it holds no events to replay");
    }
    if (Status s = expect(*segments, PyKind::list, "segments"); !s) return s.error();
    if (Status s = expect(*traces, PyKind::list, "device_traces"); !s) return s.error();

    const auto segment_items = doc_.items(*segments);
    for (std::size_t i = 0; i < segment_items.size(); ++i) {
      auto seg = read_segment(segment_items[i], "segments[" + std::to_string(i) + "]");
      if (!seg) return seg.error();
      out.segments.push_back(std::move(seg.value()));
    }
    const auto device_items = doc_.items(*traces);
    for (std::size_t d = 0; d < device_items.size(); ++d) {
      const std::string path = "device_traces[" + std::to_string(d) + "]";
      if (Status s = expect(device_items[d], PyKind::list, path); !s) return s.error();
      std::vector<SnapshotEvent> events;
      const auto items = doc_.items(device_items[d]);
      events.reserve(items.size());
      for (std::size_t e = 0; e < items.size(); ++e) {
        auto ev = read_event(items[e], path + "[" + std::to_string(e) + "]");
        if (!ev) return ev.error();
        if (ev.value()) events.push_back(*ev.value());
      }
      out.device_traces.push_back(std::move(events));
    }
    if (const PyValue* settings = doc_.find(root, "allocator_settings"); settings != nullptr && settings->kind() == PyKind::dict) {
      auto parsed = read_settings(*settings, &out.settings_config);
      if (!parsed) return parsed.error();
      out.settings = parsed.value();
    }
    for (const auto& [action, count] : skipped_actions_) {
      out.notes.push_back(std::to_string(count) + " trace events with action '" + action + "' were skipped (not modelled)");
    }
    out.sites = std::move(sites_);
    return out;
  }

 private:
  Error error(const std::string& path, const std::string& what) const {
    return Error{std::string(source_) + ": " + (path.empty() ? "" : path + ": ") + what};
  }
  Status expect(const PyValue& v, PyKind kind, const std::string& path) const {
    if (v.kind() == kind) return {};
    return error(path, "is a " + std::string(py_kind_name(v.kind())) + ", expected a " + std::string(py_kind_name(kind)));
  }
  Status expect_dict(const PyValue& v, const std::string& path) const { return expect(v, PyKind::dict, path); }

  // An int field; `required` false gives `fallback` when absent or None.
  Result<std::int64_t> int_field(const PyValue& dict, std::string_view key, const std::string& path, bool required,
                                 std::int64_t fallback = 0) const {
    const PyValue* v = doc_.find(dict, key);
    if (v == nullptr || v->kind() == PyKind::none) {
      if (required) return error(path, "the required field '" + std::string(key) + "' is missing");
      return fallback;
    }
    if (v->kind() == PyKind::integer || v->kind() == PyKind::boolean) return doc_.integer(*v);
    if (v->kind() == PyKind::big_integer) return error(path, "'" + std::string(key) + "' does not fit in 64 bits");
    return error(path, "'" + std::string(key) + "' is a " + std::string(py_kind_name(v->kind())) + ", expected an int");
  }
  Result<Bytes> size_field(const PyValue& dict, std::string_view key, const std::string& path, bool required) const {
    auto v = int_field(dict, key, path, required);
    if (!v) return v.error();
    if (v.value() < 0 || v.value() > kMaxSize) {
      return error(path, "'" + std::string(key) + "' is " + std::to_string(v.value()) +
                             " bytes, outside 0.." + std::to_string(kMaxSize));
    }
    return Bytes{v.value()};
  }
  Result<std::string_view> str_field(const PyValue& dict, std::string_view key, const std::string& path) const {
    const PyValue* v = doc_.find(dict, key);
    if (v == nullptr) return error(path, "the required field '" + std::string(key) + "' is missing");
    if (v->kind() != PyKind::string) {
      return error(path, "'" + std::string(key) + "' is a " + std::string(py_kind_name(v->kind())) + ", expected a str");
    }
    return doc_.text(*v);
  }
  bool bool_field(const PyValue& dict, std::string_view key, bool fallback) const {
    const PyValue* v = doc_.find(dict, key);
    if (v == nullptr || (v->kind() != PyKind::boolean && v->kind() != PyKind::integer)) return fallback;
    return doc_.integer(*v) != 0;
  }

  // The site of a frames list; lists the pickle shares through its memo are resolved once.
  Result<std::int32_t> site_of(const PyValue& dict, const std::string& path) {
    const PyValue* frames = doc_.find(dict, "frames");
    if (frames == nullptr || frames->kind() == PyKind::none) return kNoSite;
    if (frames->kind() != PyKind::list && frames->kind() != PyKind::tuple) {
      return error(path, "'frames' is a " + std::string(py_kind_name(frames->kind())) + ", expected a list");
    }
    if (auto it = site_of_frames_.find(frames->bits); it != site_of_frames_.end()) return it->second;
    const auto items = doc_.items(*frames);
    // Equal stacks are usually separate objects whose frame dicts share their contents in the
    // document: the contents' addresses identify the stack.
    std::string key(items.size() * sizeof(const void*), '\0');
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (items[i].kind() != PyKind::dict) {
        return error(path + ".frames[" + std::to_string(i) + "]",
                     "is a " + std::string(py_kind_name(items[i].kind())) + ", expected a dict");
      }
      const void* contents = doc_.entries(items[i]).data();
      std::memcpy(key.data() + i * sizeof(const void*), &contents, sizeof(const void*));
    }
    if (auto it = site_of_stack_.find(key); it != site_of_stack_.end()) {
      site_of_frames_.emplace(frames->bits, it->second);
      return it->second;
    }
    std::vector<StackFrame> stack;
    stack.reserve(items.size());
    for (const PyValue& item : items) {
      StackFrame f;
      if (const PyValue* v = doc_.find(item, "filename"); v != nullptr && v->kind() == PyKind::string) f.filename = doc_.text(*v);
      if (const PyValue* v = doc_.find(item, "name"); v != nullptr && v->kind() == PyKind::string) f.name = doc_.text(*v);
      if (const PyValue* v = doc_.find(item, "line"); v != nullptr && v->kind() == PyKind::integer) f.line = doc_.integer(*v);
      stack.push_back(f);
    }
    std::int32_t site = kNoSite;
    if (const auto at = user_frame_index(stack)) {
      const StackFrame& f = stack[*at];
      std::string text = std::string(f.filename) + ":" + std::to_string(f.line) + " " + std::string(f.name);
      auto [it, inserted] = site_index_.emplace(text, static_cast<std::int32_t>(sites_.size()));
      if (inserted) sites_.push_back(std::move(text));
      site = it->second;
    }
    site_of_frames_.emplace(frames->bits, site);
    site_of_stack_.emplace(std::move(key), site);
    return site;
  }

  Result<SnapshotSegment> read_segment(const PyValue& v, const std::string& path) {
    if (Status s = expect_dict(v, path); !s) return s.error();
    SnapshotSegment seg;
    auto device = int_field(v, "device", path, false);
    auto address = int_field(v, "address", path, true);
    auto total = size_field(v, "total_size", path, true);
    if (!device) return device.error();
    if (!address) return address.error();
    if (!total) return total.error();
    seg.device = device.value();
    seg.address = static_cast<std::uint64_t>(address.value());
    seg.total_size = total.value();
    auto allocated = size_field(v, "allocated_size", path, false);
    auto requested = size_field(v, "requested_size", path, false);
    auto stream = int_field(v, "stream", path, false);
    if (!allocated) return allocated.error();
    if (!requested) return requested.error();
    if (!stream) return stream.error();
    seg.allocated_size = allocated.value();
    seg.requested_size = requested.value();
    seg.stream = stream.value();
    seg.is_expandable = bool_field(v, "is_expandable", false);
    if (const PyValue* type = doc_.find(v, "segment_type"); type != nullptr && type->kind() == PyKind::string) {
      const std::string_view t = doc_.text(*type);
      if (t != "large" && t != "small") return error(path, "segment_type is '" + std::string(t) + "', expected 'large' or 'small'");
      seg.large_pool = t == "large";
    } else {
      seg.large_pool = seg.total_size != runtime::kSmallBuffer;  // small segments are 2 MiB
    }
    const PyValue* blocks = doc_.find(v, "blocks");
    if (blocks == nullptr) return error(path, "the required field 'blocks' is missing");
    if (Status s = expect(*blocks, PyKind::list, path + ".blocks"); !s) return s.error();
    Bytes covered = 0;
    const auto items = doc_.items(*blocks);
    for (std::size_t i = 0; i < items.size(); ++i) {
      const std::string bpath = path + ".blocks[" + std::to_string(i) + "]";
      if (Status s = expect_dict(items[i], bpath); !s) return s.error();
      SnapshotBlock b;
      auto size = size_field(items[i], "size", bpath, true);
      auto req = size_field(items[i], "requested_size", bpath, false);
      auto state = str_field(items[i], "state", bpath);
      if (!size) return size.error();
      if (!req) return req.error();
      if (!state) return state.error();
      b.size = size.value();
      b.requested_size = req.value();
      if (state.value() == "active_allocated") {
        b.state = runtime::BlockState::active_allocated;
      } else if (state.value() == "active_pending_free") {
        b.state = runtime::BlockState::active_pending_free;
      } else if (state.value() == "inactive") {
        b.state = runtime::BlockState::inactive;
      } else {
        return error(bpath, "state '" + std::string(state.value()) +
                                "' is not one of active_allocated, active_pending_free, inactive");
      }
      // Older PyTorch omits block addresses: blocks tile the segment in order.
      auto addr = int_field(items[i], "address", bpath, false, static_cast<std::int64_t>(seg.address + static_cast<std::uint64_t>(covered)));
      if (!addr) return addr.error();
      b.address = static_cast<std::uint64_t>(addr.value());
      auto site = site_of(items[i], bpath);
      if (!site) return site.error();
      b.site = site.value();
      if (b.size > seg.total_size - covered) {
        return error(bpath, "blocks add up to more than the segment's total_size " + std::to_string(seg.total_size));
      }
      covered += b.size;
      seg.blocks.push_back(b);
    }
    return seg;
  }

  // nullopt for an action the replay does not model (counted in notes).
  Result<std::optional<SnapshotEvent>> read_event(const PyValue& v, const std::string& path) {
    if (Status s = expect_dict(v, path); !s) return s.error();
    auto action = str_field(v, "action", path);
    if (!action) return action.error();
    SnapshotEvent e;
    static constexpr SnapshotAction kAll[] = {
        SnapshotAction::alloc, SnapshotAction::free_requested, SnapshotAction::free_completed,
        SnapshotAction::segment_alloc, SnapshotAction::segment_free, SnapshotAction::segment_map,
        SnapshotAction::segment_unmap, SnapshotAction::oom, SnapshotAction::snapshot};
    bool known = false;
    for (SnapshotAction a : kAll) {
      if (snapshot_action_name(a) == action.value()) {
        e.action = a;
        known = true;
      }
    }
    if (!known) {
      ++skipped_actions_[std::string(action.value().substr(0, 40))];
      return std::optional<SnapshotEvent>{};
    }
    const bool is_oom = e.action == SnapshotAction::oom;
    const bool is_marker = e.action == SnapshotAction::snapshot;
    // An oom carries the device's free bytes in `device_free` (older files put it in `addr`).
    auto addr = int_field(v, is_oom ? "device_free" : "addr", path, false, -1);
    if (!addr) return addr.error();
    if (addr.value() < 0 && is_oom) {
      addr = int_field(v, "addr", path, false, 0);
      if (!addr) return addr.error();
    } else if (addr.value() < 0 && !is_marker) {
      return error(path, "the required field 'addr' is missing");
    }
    e.address = static_cast<std::uint64_t>(std::max<std::int64_t>(addr.value(), 0));
    auto size = size_field(v, "size", path, !is_marker);
    auto stream = int_field(v, "stream", path, false);
    auto time = int_field(v, "time_us", path, false);
    if (!size) return size.error();
    if (!stream) return stream.error();
    if (!time) return time.error();
    e.size = size.value();
    e.stream = stream.value();
    e.time_us = time.value();
    auto site = site_of(v, path);
    if (!site) return site.error();
    e.site = site.value();
    return std::optional<SnapshotEvent>{e};
  }

  Result<runtime::CachingAllocatorOptions> read_settings(const PyValue& v, std::string* config) {
    const std::string path = "allocator_settings";
    runtime::CachingAllocatorOptions o;
    if (const PyValue* conf = doc_.find(v, "PYTORCH_CUDA_ALLOC_CONF"); conf != nullptr && conf->kind() == PyKind::string) {
      *config = std::string(doc_.text(*conf));
    }
    auto split = int_field(v, "max_split_size", path, false, -1);
    if (!split) return split.error();
    // PyTorch reports "unlimited" as -1 or as SIZE_MAX (which pickles beyond int64).
    if (split.value() >= runtime::kLargeBuffer) o.max_split_size = split.value();
    if (const PyValue* gc = doc_.find(v, "garbage_collection_threshold"); gc != nullptr) {
      const double t = gc->kind() == PyKind::floating ? doc_.floating(*gc) : gc->kind() == PyKind::integer ? double(doc_.integer(*gc)) : 0.0;
      if (t > 0.0 && t < 1.0) o.garbage_collection_threshold = t;
    }
    o.expandable_segments = bool_field(v, "expandable_segments", false);
    // Either a dict {"1": d, "2": d, ...} keyed by MiB, or a list of 16 entries.
    if (const PyValue* r = doc_.find(v, "roundup_power2_divisions"); r != nullptr) {
      auto set_entry = [&](std::size_t index, const PyValue& d) -> Status {
        if (d.kind() != PyKind::integer || doc_.integer(d) < 0 || doc_.integer(d) > (1 << 20) ||
            (doc_.integer(d) & (doc_.integer(d) - 1)) != 0) {
          return error(path, "roundup_power2_divisions has " + doc_.describe(d) + ", expected 0 or a power of two");
        }
        if (index < o.roundup_power2_divisions.size()) o.roundup_power2_divisions[index] = static_cast<int>(doc_.integer(d));
        return {};
      };
      if (r->kind() == PyKind::dict) {
        const auto kv = doc_.entries(*r);
        for (std::size_t e = 0; e + 1 < kv.size(); e += 2) {
          const PyValue& key = kv[e];
          const PyValue& value = kv[e + 1];
          std::int64_t mb = -1;
          if (key.kind() == PyKind::string) {
            const std::string_view k = doc_.text(key);
            mb = 0;
            for (char c : k) mb = (c >= '0' && c <= '9' && mb < (1 << 30)) ? mb * 10 + (c - '0') : -1;
            if (k.empty()) mb = -1;
          } else if (key.kind() == PyKind::integer) {
            mb = doc_.integer(key);
          }
          if (mb <= 0 || (mb & (mb - 1)) != 0) return error(path, "roundup_power2_divisions key " + doc_.describe(key) + " is not a power of two");
          if (Status s = set_entry(static_cast<std::size_t>(std::countr_zero(static_cast<std::uint64_t>(mb))), value); !s) return s.error();
        }
      } else if (r->kind() == PyKind::list) {
        const auto items = doc_.items(*r);
        for (std::size_t i = 0; i < items.size(); ++i) {
          if (Status s = set_entry(i, items[i]); !s) return s.error();
        }
      }
    }
    return o;
  }

  static constexpr Bytes kMaxSize = Bytes{1} << 50;  // 1 PiB: beyond any device

  const PickleDocument& doc_;
  std::string_view source_;
  std::vector<std::string> sites_;
  std::unordered_map<std::string, std::int32_t> site_index_;
  std::unordered_map<std::uint64_t, std::int32_t> site_of_frames_;  // by the frames list's identity
  std::unordered_map<std::string, std::int32_t> site_of_stack_;     // by its frames' contents
  std::map<std::string, std::int64_t> skipped_actions_;
};

}  // namespace

Result<MemorySnapshot> parse_memory_snapshot(std::string_view bytes, std::string_view source) {
  auto doc = parse_pickle(bytes);
  if (!doc) return Error{std::string(source) + ": not a readable snapshot pickle: " + doc.error().message};
  return SchemaReader(doc.value(), source).read();
}

Result<MemorySnapshot> read_memory_snapshot(const std::string& path, const SnapshotReadLimits& limits) {
  Result<std::string> bytes = read_regular_file(path, limits.max_file_bytes, "PyTorch memory snapshot (.pickle)");
  if (!bytes) return bytes.error();
  return parse_memory_snapshot(bytes.value(), path);
}

}  // namespace memplan::trace
