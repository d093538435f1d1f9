# Writes OUT, a C++ source holding the text of every CONFIG_DIR/*.json as shipped_configs()
# (models/hf_config.h): the configs ship inside the library. Run by models/CMakeLists.txt at
# build time, whenever a config changes.
file(GLOB files ${CONFIG_DIR}/*.json)
list(SORT files)
set(rows "")
foreach(path IN LISTS files)
  get_filename_component(name ${path} NAME)
  file(READ ${path} text)
  string(FIND "${text}" ")memplan_json\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${path} contains the raw-string delimiter )memplan_json\"")
  endif()
  string(APPEND rows "      {\"${name}\", R\"memplan_json(${text})memplan_json\"},\n")
endforeach()
file(WRITE ${OUT}.tmp "// Generated from models/configs/*.json by models/embed_configs.cmake; edit those files.
#include \"memplan/models/hf_config.h\"

namespace memplan::models {

const std::vector<ShippedConfig>& shipped_configs() {
  static const std::vector<ShippedConfig> kConfigs = {
${rows}  };
  return kConfigs;
}

}  // namespace memplan::models
")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
