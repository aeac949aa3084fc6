// The MPI tests' program. Run under mpiexec it is a Boost.Test runner in every process; with
// `--scenario=NAME` it is one worker of a job that the failure tests start, kill and restart.
#ifndef BOOST_TEST_DYN_LINK  // CMake already defines it; the guard avoids a redefinition warning
#  define BOOST_TEST_DYN_LINK
#endif
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <boost/test/unit_test.hpp>

#include <string_view>

int run_scenario(int argc, char** argv);  // scenarios.cpp

namespace {
bool init_unit_test() {
  boost::unit_test::framework::master_test_suite().p_name.value = "distribute_mpi";
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]).starts_with("--scenario=")) return run_scenario(argc, argv);
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
