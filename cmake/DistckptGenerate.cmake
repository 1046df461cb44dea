# distckpt_generate(TARGET <target> SCHEMAS <a.shard>... [OUT_DIR <dir>])
#
# Runs distckpt-gen on each schema at build time and adds the generated
# NAME.shard.h / NAME.shard.cpp to <target>, like protobuf_generate() or
# flatbuffers_generate_headers(). The code is regenerated when a schema or the
# generator changes. Include the header as "NAME.shard.h".
function(distckpt_generate)
  cmake_parse_arguments(ARG "" "TARGET;OUT_DIR" "SCHEMAS" ${ARGN})
  if(NOT ARG_TARGET)
    message(FATAL_ERROR "distckpt_generate: TARGET is required")
  endif()
  if(NOT ARG_SCHEMAS)
    message(FATAL_ERROR "distckpt_generate: SCHEMAS is required (one or more *.shard files)")
  endif()
  if(NOT TARGET distckpt::gen)
    message(FATAL_ERROR "distckpt_generate: the distckpt::gen target is unknown; find_package(distckpt) first")
  endif()
  if(NOT ARG_OUT_DIR)
    set(ARG_OUT_DIR ${CMAKE_CURRENT_BINARY_DIR}/distckpt_generated/${ARG_TARGET})
  endif()
  foreach(schema IN LISTS ARG_SCHEMAS)
    get_filename_component(schema_path ${schema} ABSOLUTE)
    get_filename_component(schema_name ${schema} NAME)
    set(header ${ARG_OUT_DIR}/${schema_name}.h)
    set(source ${ARG_OUT_DIR}/${schema_name}.cpp)
    add_custom_command(
      OUTPUT ${header} ${source}
      COMMAND $<TARGET_FILE:distckpt::gen> ${schema_path} --out-dir ${ARG_OUT_DIR}
      DEPENDS ${schema_path} $<TARGET_FILE:distckpt::gen>
      COMMENT "distckpt-gen ${schema_name}"
      VERBATIM)
    target_sources(${ARG_TARGET} PRIVATE ${header} ${source})
  endforeach()
  target_include_directories(${ARG_TARGET} PUBLIC $<BUILD_INTERFACE:${ARG_OUT_DIR}>)
  target_link_libraries(${ARG_TARGET} PUBLIC distckpt::distckpt)
endfunction()
