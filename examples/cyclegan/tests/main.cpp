#define BOOST_TEST_MODULE cyclegan
#include <boost/test/unit_test.hpp>
