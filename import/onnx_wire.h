// The protobuf wire format, as far as leaving the initializers' raw_data out of a parse needs it:
// ModelProto.graph (field 7) -> GraphProto.initializer (field 5) -> TensorProto.raw_data (field 9).
// No protobuf types here: bytes in, bytes and views out. Internal to import/.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace memplan::import {

// `bytes` without the raw_data of the graph's initializers, which go to `raw` in order as views
// of `bytes` (an empty view for an initializer without raw_data). False on anything this reader
// does not take (malformed bytes, groups): the caller then lets protobuf parse `bytes` itself and
// say what is wrong.
bool strip_initializer_data(std::string_view bytes, std::string& stripped, std::vector<std::string_view>& raw);

}  // namespace memplan::import
