#pragma once
// The short name of a layer type for error messages: "conv2d" for distribute::nn::conv2d<float, cpu>,
// "residual" for a user's cyclegan::residual<cpu>.

#include <cstdlib>
#include <memory>
#include <string>
#include <typeinfo>
#if __has_include(<cxxabi.h>)
#  include <cxxabi.h>
#endif

namespace distribute::nn::detail {

template <class L>
std::string layer_name() {
  std::string name = typeid(L).name();
#if __has_include(<cxxabi.h>)
  int status = 0;
  const std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status),
                                                         std::free);
  if (status == 0 && demangled) name = demangled.get();
#endif
  if (const auto lt = name.find('<'); lt != std::string::npos) name.resize(lt);
  if (const auto colon = name.rfind("::"); colon != std::string::npos) name.erase(0, colon + 2);
  return name;
}

}  // namespace distribute::nn::detail
