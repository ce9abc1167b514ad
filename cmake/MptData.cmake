# Chapter 02 — loss scaling and FP32 master weights: the real data sets.
# Depends on: the `mpt_nn` target (include this after it exists), zlib
# (Debian: zlib1g-dev), tools/fetch_digits.sh.
#
# MPT_DATA_DIR is where the library looks for digits.csv.gz by default
# (the environment variable MPT_DATA_DIR overrides it at run time).
# `cmake --build <build> --target fetch-data` extracts the file there from
# Debian's python3-sklearn package; nothing is downloaded at run time.
set(MPT_DATA_DIR "${PROJECT_BINARY_DIR}/data" CACHE PATH
    "Directory holding the real data sets (digits.csv.gz); the env var MPT_DATA_DIR overrides it at run time")

find_package(ZLIB REQUIRED)  # gzip reading in src/mpt/nn/data/data.cpp
target_link_libraries(mpt_nn PRIVATE ZLIB::ZLIB)
target_compile_definitions(mpt_nn PRIVATE
  MPT_DEFAULT_DATA_DIR="${MPT_DATA_DIR}"
  MPT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

add_custom_target(fetch-data
  COMMAND bash ${PROJECT_SOURCE_DIR}/tools/fetch_digits.sh ${MPT_DATA_DIR}
  COMMENT "Extracting digits.csv.gz from Debian's python3-sklearn into ${MPT_DATA_DIR}"
  USES_TERMINAL VERBATIM)
