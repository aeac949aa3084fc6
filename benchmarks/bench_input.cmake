# bench_input: the Fashion-MNIST input pipeline (included by benchmarks/CMakeLists.txt).
# IDX files are gzip: zlib. (The bench reads no images, so it needs no stb.)
find_package(ZLIB REQUIRED)
add_executable(bench_input ${CMAKE_CURRENT_LIST_DIR}/bench_input.cpp)
target_link_libraries(bench_input PRIVATE distribute::distribute ZLIB::ZLIB)
distribute_enable_warnings(bench_input)
