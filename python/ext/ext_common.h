// python/ext/ext_common.h: what every file of the bitroll_kernels_ext module shares: the numpy
// array types it takes (C-contiguous float32 / int32) and the check that turns bad input into a
// Python ValueError (std::invalid_argument) instead of a crash.
#pragma once

#include <pybind11/numpy.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace bitroll_ext {

using F32 = pybind11::array_t<float, pybind11::array::c_style>;
using I32 = pybind11::array_t<int32_t, pybind11::array::c_style>;

inline void Require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

}  // namespace bitroll_ext
