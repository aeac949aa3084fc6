#define BOOST_TEST_MODULE distribute_core
#ifndef BOOST_TEST_DYN_LINK  // CMake already defines it; the guard avoids a redefinition warning
#  define BOOST_TEST_DYN_LINK
#endif
#include <boost/test/unit_test.hpp>
